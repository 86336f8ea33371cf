"""Request bodies and response shaping of the OpenAI-compatible engine server (vLLM's shapes).

Requests accept vLLM's fields; fields that would change results and that this server does not implement
(beam search, penalties, echo, streaming, best_of > n) are refused with 400 rather than silently ignored;
other unknown fields are ignored, as vLLM does.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from serving.protocol import Completion


class BadRequest(ValueError):
    """A request the server refuses with HTTP 400 and this message."""


class _Base(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    n: int = Field(1, ge=1, le=256)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    request_id: str | None = None
    stream: bool = False

    def refuse_unsupported(self) -> None:
        extra = self.model_extra or {}
        checks = {
            "stream": self.stream,
            "use_beam_search": bool(extra.get("use_beam_search")),
            "best_of": extra.get("best_of") not in (None, self.n),
            "echo": bool(extra.get("echo")),
            "presence_penalty": extra.get("presence_penalty") not in (None, 0, 0.0),
            "frequency_penalty": extra.get("frequency_penalty") not in (None, 0, 0.0),
            "repetition_penalty": extra.get("repetition_penalty") not in (None, 1, 1.0),
            "logit_bias": bool(extra.get("logit_bias")),
            "prompt_logprobs": extra.get("prompt_logprobs") is not None,
        }
        refused = [k for k, bad in checks.items() if bad]
        if refused:
            raise BadRequest(f"not supported by this server: {', '.join(refused)}")

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        if any(not s for s in stops):
            raise BadRequest("stop strings must be non-empty")
        return stops


class CompletionBody(_Base):
    """POST /v1/completions."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)

    def prompts(self, tokenizer) -> list[list[int]]:
        """Every prompt as token ids (strings are tokenised with special tokens, as vLLM does)."""
        p = self.prompt
        if isinstance(p, str):
            return [tokenizer.encode(p)]
        if not p:
            raise BadRequest("prompt is empty")
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        if all(isinstance(x, str) for x in p):
            return [tokenizer.encode(x) for x in p]  # type: ignore[arg-type]
        if all(isinstance(x, list) for x in p):
            return [list(x) for x in p]  # type: ignore[arg-type]
        raise BadRequest("prompt must be a string, a list of strings, a list of token ids, or a list of such lists")


class ChatBody(_Base):
    """POST /v1/chat/completions."""

    messages: list[dict[str, Any]]
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None

    def prompt_ids(self, tokenizer) -> list[int]:
        if not self.messages:
            raise BadRequest("messages is empty")
        try:
            text = tokenizer.apply_chat_template(
                self.messages, tools=self.tools, add_generation_prompt=self.add_generation_prompt, tokenize=False,
                **(self.chat_template_kwargs or {}))
        except Exception as e:  # jinja errors on malformed messages
            raise BadRequest(f"chat template failed on these messages: {e}") from e
        return tokenizer.encode(text, add_special_tokens=False)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def token_str(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)


def output_text(tokenizer, body: _Base, completion: Completion) -> str:
    """The decoded output; a matched stop string is cut off unless `include_stop_str_in_output` (vLLM rule)."""
    text = tokenizer.decode(completion.output_ids, skip_special_tokens=body.skip_special_tokens)
    stop = completion.stop_reason
    if isinstance(stop, str) and not body.include_stop_str_in_output:
        cut = text.rfind(stop)
        if cut >= 0:
            text = text[:cut]
    return text


def completion_logprobs(tokenizer, completion, k: int) -> dict[str, Any]:
    """vLLM/OpenAI legacy shape: tokens, token_logprobs, top_logprobs (sampled token + top k), text_offset."""
    tokens = [token_str(tokenizer, t) for t in completion.output_ids]
    tops = getattr(completion, "top_logprobs", None) or [[] for _ in tokens]
    top_dicts, offsets, offset = [], [], 0
    for tok, lp, top in zip(tokens, completion.logprobs, tops, strict=False):
        d = {token_str(tokenizer, i): v for i, v in top[:k]}
        d.setdefault(tok, lp)
        top_dicts.append(d)
        offsets.append(offset)
        offset += len(tok)
    return {"tokens": tokens, "token_logprobs": list(completion.logprobs), "top_logprobs": top_dicts,
            "text_offset": offsets}


def chat_logprobs(tokenizer, completion, k: int) -> dict[str, Any]:
    """OpenAI chat shape: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}."""
    def entry(token_id: int, lp: float) -> dict[str, Any]:
        s = token_str(tokenizer, token_id)
        return {"token": s, "logprob": lp, "bytes": list(s.encode())}

    tops = getattr(completion, "top_logprobs", None) or [[] for _ in completion.output_ids]
    content = []
    for t, lp, top in zip(completion.output_ids, completion.logprobs, tops, strict=False):
        content.append({**entry(t, lp), "top_logprobs": [entry(i, v) for i, v in top[:k]]})
    return {"content": content}


def usage(prompt_lens: list[int], completions: list[Completion]) -> dict[str, int]:
    p, c = sum(prompt_lens), sum(len(x.output_ids) for x in completions)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def envelope(kind: str, model: str, choices: list[dict], use: dict, **extra) -> dict[str, Any]:
    return {"id": new_id("cmpl" if kind == "text_completion" else "chatcmpl"), "object": kind,
            "created": int(time.time()), "model": model, "choices": choices, "usage": use, **extra}
