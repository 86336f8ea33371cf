"""Build the InferenceEngine an `engine:` config section describes.

    engine = build_engine(cfg.engine)     # EngineConfig -> InferenceEngine

`embedded` loads the model into this process (serving.engines.embedded.EmbeddedEngine). The remote backends
(`http` for our own server, `vllm`, `sglang`) are clients of servers named by `urls`.
"""

from __future__ import annotations

from typing import Any, get_args

from core.choices import check_choices
from core.ranges import check_ranges
from serving.config import EngineBackend, EngineConfig
from serving.protocol import InferenceEngine

BACKENDS: tuple[str, ...] = get_args(EngineBackend)


def build_engine(cfg: EngineConfig) -> InferenceEngine:
    """An engine for `cfg` (raises ValueError naming the key and the valid values for an unknown backend or dtype)."""
    check_choices(cfg, "engine")
    check_ranges(cfg, "engine")
    if cfg.backend == "embedded":
        from serving.engines.embedded import EmbeddedEngine

        return EmbeddedEngine(
            cfg.model, dtype=cfg.dtype, device=cfg.device, max_batch_size=cfg.max_batch_size,
            max_model_len=cfg.max_model_len, prefill_chunk_tokens=cfg.prefill_chunk_tokens,
            kv_cache_gb=cfg.kv_cache_gb, prefix_cache_gb=cfg.prefix_cache_gb, threads=cfg.threads, seed=cfg.seed)
    from serving.engines.pool import build_remote

    return build_remote(cfg.backend, list(cfg.urls), cfg.model, request_timeout_s=cfg.request_timeout_s)


def build_llm(backend: str, model: str, urls: list[str], *, api_key_env: str = "OPENAI_API_KEY",
              timeout_s: float | None = None, what: str = "model") -> Any:
    """A text-generation transport for a role that is not the policy (a judge, a QA generator or solver):
    an OpenAIChatClient for `openai` (messages in, text out), else an InferenceEngine built by
    `build_engine`. `what` names the config section in errors, e.g. `agent.judge`."""
    if backend == "openai":
        from serving.servers.openai_chat import OpenAIChatClient

        if not urls:
            raise ValueError(f"{what}.backend=openai needs {what}.urls: the API base of an OpenAI-compatible "
                             f"endpoint, e.g. {what}.urls=[https://api.openai.com/v1]")
        return OpenAIChatClient(urls[0], model, api_key_env=api_key_env, timeout_s=timeout_s)
    return build_engine(EngineConfig(model=model, backend=backend, urls=list(urls), request_timeout_s=timeout_s))


def is_chat_client(transport: Any) -> bool:
    """True for a messages-in, text-out client (OpenAIChatClient), False for an InferenceEngine."""
    return callable(getattr(transport, "chat", None)) and not callable(getattr(transport, "generate", None))


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, str]], prefill: str = "") -> list[int]:
    """Chat messages as the token ids an engine generates from: the tokenizer's chat template with the
    assistant turn opened, then `prefill` (the start of the reply). A tokenizer without a template (tiny
    test models) gets the messages' texts in order."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    else:
        text = "\n\n".join(m["content"] for m in messages) + "\n"
    return tokenizer.encode(text + prefill, add_special_tokens=False)
