"""Build the InferenceEngine an `engine:` config section describes.

    engine = build_engine(cfg.engine)     # EngineConfig -> InferenceEngine

`embedded` loads the model into this process (serving.embedded.EmbeddedEngine). The remote backends
(`http` for our own server, `vllm`, `sglang`) are clients of servers named by `urls`.
"""

from __future__ import annotations

from typing import get_args

from core.choices import check_choices
from serving.config import EngineBackend, EngineConfig
from serving.protocol import InferenceEngine

BACKENDS: tuple[str, ...] = get_args(EngineBackend)


def build_engine(cfg: EngineConfig) -> InferenceEngine:
    """An engine for `cfg` (raises ValueError naming the key and the valid values for an unknown backend or dtype)."""
    check_choices(cfg, "engine")
    if cfg.backend == "embedded":
        from serving.embedded import EmbeddedEngine

        return EmbeddedEngine(
            cfg.model, dtype=cfg.dtype, device=cfg.device, max_batch_size=cfg.max_batch_size,
            max_model_len=cfg.max_model_len, prefill_chunk_tokens=cfg.prefill_chunk_tokens,
            kv_cache_gb=cfg.kv_cache_gb, prefix_cache_gb=cfg.prefix_cache_gb, threads=cfg.threads, seed=cfg.seed)
    from serving.pool import build_remote

    return build_remote(cfg.backend, list(cfg.urls), cfg.model, request_timeout_s=cfg.request_timeout_s)
