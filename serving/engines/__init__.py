"""Engines that generate in this process: the embedded engine (PyTorch; C decode kernels on CPU), its KV cache
and weights, the replica pool that routes episodes over several engines, and the scripted engines (a test
double and the SFT oracle) that implement the same protocol (serving/protocol.py)."""
