"""The synthesis pipeline's models: chat messages in, text out, every token counted.

A `ChatLLM` wraps either an InferenceEngine (the embedded model, our server, vLLM, SGLang, a
ScriptedEngine in tests) or an OpenAIChatClient. Over an engine the chat template is applied with
the engine's tokenizer and the call goes through `generate_continuing` (so a weight-update abort
never loses a reply); token counts are exact. Over an OpenAI endpoint they are the reply's `usage`.

Every call adds to a `Usage` (one per item, so the report can give tokens and cost per accepted
question) and to the model's own totals. `open_models(cfg)` builds the generator, solver and judge
of a DatagenConfig, sharing one embedded engine between roles that name the same embedded model.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from datagen.config import DatagenConfig
from serving.factory import chat_prompt_ids, is_chat_client
from serving.protocol import GenerateRequest, SamplingParams, generate_continuing


@dataclass
class Usage:
    """Calls, tokens and cost of one item (or of a whole run, when summed)."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    def add(self, other: Usage) -> None:
        """Add another usage to this one."""
        self.calls += other.calls
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cost_usd += other.cost_usd


class ChatLLM:
    """One role's model (see module docstring). `name` is what the dataset's provenance records."""

    def __init__(self, transport: Any, name: str, *, max_new_tokens: int = 384, temperature: float = 0.7,
                 timeout_s: float | None = None, usd_per_mtok_in: float = 0.0, usd_per_mtok_out: float = 0.0):
        self.transport = transport
        self.name = name
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.timeout_s = timeout_s
        self.prices = (usd_per_mtok_in, usd_per_mtok_out)
        self.totals = Usage()

    async def complete(self, messages: list[dict[str, str]], usage: Usage, *, temperature: float | None = None,
                       max_new_tokens: int | None = None, seed: int | None = None, prefill: str = "") -> str:
        """The model's reply to `messages`; counted in `usage` and in this model's totals. Transport
        failures and timeouts raise (the caller ends the item as an error, never as a verdict).

        `prefill` starts the reply over an engine (e.g. `Question:`), which is what keeps a small model
        on the format; the reply returned includes it. A chat endpoint cannot be prefilled: there the
        prompt's format instruction does the work, and a reply that already starts with it is left alone."""
        temperature = self.temperature if temperature is None else temperature
        max_new = max_new_tokens or self.max_new_tokens
        if is_chat_client(self.transport):
            got: dict[str, Any] = {}
            call = self.transport.chat(messages, temperature=temperature, max_tokens=max_new, seed=seed, usage=got)
            text = await (asyncio.wait_for(call, self.timeout_s) if self.timeout_s else call)
            if prefill and not text.lstrip().lower().startswith(prefill.strip().lower()):
                text = f"{prefill} {text}"
            n_in, n_out = int(got.get("prompt_tokens", 0)), int(got.get("completion_tokens", 0))
        else:
            ids = chat_prompt_ids(self.transport.tokenizer, messages, prefill)
            request = GenerateRequest(prompt_ids=ids, sampling=SamplingParams(
                temperature=temperature, max_new_tokens=max_new, seed=seed))
            call = generate_continuing(self.transport, request)
            out = await (asyncio.wait_for(call, self.timeout_s) if self.timeout_s else call)
            text = prefill + self.transport.tokenizer.decode(out.output_ids, skip_special_tokens=True)
            n_in, n_out = len(ids), len(out.output_ids)
        if "</think>" in text:  # a reasoning model's thoughts are not its reply (the labels come after them)
            text = text.rsplit("</think>", 1)[1].lstrip()
        one = Usage(1, n_in, n_out, (n_in * self.prices[0] + n_out * self.prices[1]) / 1e6)
        usage.add(one)
        self.totals.add(one)
        return text


@dataclass
class Models:
    """The three roles of a synthesis run and the transports they own."""

    generator: ChatLLM
    solver: ChatLLM
    judge: Any
    """An agent.judge.LLMJudge (verdicts cached)."""
    owned: list[Any]

    def names(self) -> dict[str, str]:
        """Model names per role, for provenance."""
        return {"generator": self.generator.name, "solver": self.solver.name, "judge": self.judge.model_name}

    async def aclose(self) -> None:
        """Close the judge and every transport built here."""
        await self.judge.aclose()
        for transport in self.owned:
            close = getattr(transport, "aclose", None)
            if close is not None:
                await close()


def open_models(cfg: DatagenConfig, engine: Any = None) -> Models:
    """The generator, solver and judge of a DatagenConfig. `engine` (tests, or a caller that already holds
    one) serves every role instead of the configured backends."""
    from agent.judge import build_judge
    from serving.factory import build_llm

    built: dict[tuple, Any] = {}

    def transport(c: Any, what: str) -> Any:
        if engine is not None:
            return engine
        key = (c.backend, c.model, tuple(c.urls))
        if key not in built:
            built[key] = build_llm(c.backend, c.model, list(c.urls), api_key_env=c.api_key_env,
                                   timeout_s=c.timeout_s, what=what)
        return built[key]

    def chat(c: Any, what: str) -> ChatLLM:
        return ChatLLM(transport(c, what), c.model, max_new_tokens=c.max_new_tokens, temperature=c.temperature,
                       timeout_s=c.timeout_s, usd_per_mtok_in=c.usd_per_mtok_in, usd_per_mtok_out=c.usd_per_mtok_out)

    generator = chat(cfg.generator, "datagen.generator")
    solver = chat(cfg.solver, "datagen.solver")
    j = cfg.judge
    shared = engine if engine is not None else built.get((j.backend, j.model, tuple(j.urls)))
    judge = build_judge(j, engine=shared) if shared is not None else build_judge(j)
    return Models(generator, solver, judge, owned=list(built.values()))
