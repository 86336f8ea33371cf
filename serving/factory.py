"""Build the InferenceEngine an `engine:` config section describes.

    engine = build_engine(cfg.engine)     # EngineConfig -> InferenceEngine

`embedded` loads the model into this process (serving.embedded.EmbeddedEngine). The remote backends
(`http` for our own server, `vllm`, `sglang`) are clients of servers named by `urls`.
"""

from __future__ import annotations

from serving.config import EngineConfig
from serving.protocol import InferenceEngine

BACKENDS = ("embedded", "http", "vllm", "sglang")


def build_engine(cfg: EngineConfig) -> InferenceEngine:
    """An engine for `cfg` (raises ValueError naming the valid backends for an unknown one)."""
    if cfg.backend == "embedded":
        from serving.embedded import EmbeddedEngine

        return EmbeddedEngine(
            cfg.model, dtype=cfg.dtype, device=cfg.device, max_batch_size=cfg.max_batch_size,
            max_model_len=cfg.max_model_len, prefill_chunk_tokens=cfg.prefill_chunk_tokens,
            kv_cache_gb=cfg.kv_cache_gb, prefix_cache_gb=cfg.prefix_cache_gb, threads=cfg.threads, seed=cfg.seed)
    if cfg.backend in ("http", "vllm", "sglang"):
        from serving.pool import build_remote

        return build_remote(cfg.backend, list(cfg.urls), cfg.model, request_timeout_s=cfg.request_timeout_s)
    raise ValueError(f"unknown engine backend '{cfg.backend}'; valid: {', '.join(BACKENDS)}")
