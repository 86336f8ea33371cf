"""Build the InferenceEngine an `engine:` config section describes.

    engine = build_engine(cfg.engine)     # EngineConfig -> InferenceEngine

The backend's record (serving/backends.py) says how: `embedded` loads the model into this process; the
remote backends (`http` for our own server, `vllm`, `sglang`, or your own) are clients of servers named by
`urls`, pooled when there are several.
"""

from __future__ import annotations

from typing import Any

from core.choices import check_choices
from core.ranges import check_ranges
from serving.backends import engine_backend
from serving.config import EngineConfig
from serving.protocol import InferenceEngine


def build_engine(cfg: EngineConfig) -> InferenceEngine:
    """An engine for `cfg` (raises ValueError naming the key and the valid values for an unknown backend or dtype)."""
    check_choices(cfg, "engine")
    check_ranges(cfg, "engine")
    backend = engine_backend(cfg.backend)
    if backend.engine is not None:
        return backend.engine(cfg)
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
