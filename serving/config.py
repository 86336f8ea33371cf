"""Inference engine configuration (section `engine`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from core.ranges import ranged

Dtype = Literal["auto", "bfloat16", "float16", "float32"]


@dataclass
class EngineConfig:
    model: str = "smollm2-135m-instruct"
    """Model spec: a built-in alias (`smollm2-135m-instruct`, `tiny-random`), a local HF folder, or a hub id."""
    backend: str = "embedded"
    """`embedded` (transformers in this process), `http` (our OpenAI-compatible server), `vllm`, `sglang`, or
    a backend of your own (serving/backends.py: a registered name or `pkg.mod:BACKEND`)."""
    urls: list[str] = field(default_factory=list)
    """Base URLs of remote servers for the `http`, `vllm` and `sglang` backends (a pool when several)."""
    dtype: Dtype = "auto"
    """`auto` (bf16 where the CPU/GPU supports it, else fp32), `bfloat16`, `float16` or `float32`."""
    device: str = "auto"
    """`auto` (cuda when available, else cpu), `cpu`, `cuda` or `cuda:N`."""
    max_batch_size: int = ranged(64, ge=1)
    """Most sequences the embedded engine decodes together in one step (continuous batching)."""
    max_model_len: int = ranged(4096, ge=1)
    """Longest prompt + output the engine accepts, in tokens."""
    threads: int = 0
    """Torch CPU threads for the embedded engine (0: leave torch's default)."""
    prefill_chunk_tokens: int = ranged(1024, ge=1)
    """Embedded engine: prompt tokens prefilled per forward pass; running requests take one decoding step
    between two chunks, so a long prompt never stalls them for long."""
    kv_cache_gb: float = 2.0
    """Embedded engine: memory bound of the running batch's KV slots (rows x longest projected length);
    requests wait for admission when the batch would exceed it."""
    prefix_cache_gb: float = 1.0
    """Embedded engine: KV of finished requests kept by request id (LRU), so the next turn of a multi-turn
    agent prefills only its new tokens; 0 disables it."""
    seed: int = 0
    """Embedded engine: seed of the shared sampling stream (requests with their own `seed` use their own)."""
    request_timeout_s: float = ranged(600.0, gt=0)
    """Timeout of one generate call against a remote engine."""
    tensor_parallel_size: int = ranged(1, ge=1)
    """GPUs per vLLM/SGLang server that `hexsearch train` starts itself (`backend=vllm|sglang` without `urls`:
    `train.engine_replicas` servers, trainer/managed_servers.py)."""
