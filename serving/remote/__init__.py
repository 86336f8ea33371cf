"""Clients of inference servers (our own engine server, vLLM, SGLang) that implement InferenceEngine, and the
in-memory weight transfer from learner rank 0 to those servers (NCCL)."""
