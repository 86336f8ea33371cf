"""LLM-as-judge over any InferenceEngine or any OpenAI-compatible chat endpoint, with a persistent cache.

The judge is asked whether a predicted answer means the same as one of the gold answers and must
end with one line `VERDICT: CORRECT` or `VERDICT: INCORRECT` (a JSON object `{"verdict": "correct"}` is accepted
too; a verdict line naming both is ambiguous). Anything else is recorded as unparseable
(`Verdict.correct is None`), retried up to `retries` times with a new seed, and scored 0 by the
reward, never guessed. Verdicts are cached in SQLite, keyed by a hash of (prompt version, judge
model, question, sorted gold answers, prediction), so a re-run of an evaluation costs no judge calls.

Two transports carry the same messages (system + user for the built-in prompt) and return text:

- an **InferenceEngine** (embedded, our server, vLLM, SGLang, a Ray EngineProxy, ScriptedEngine): the
  chat template is applied with the engine's tokenizer and token ids go through `generate_continuing`,
  so a judge sharing an engine with training survives weight-update aborts;
- an **OpenAIChatClient** (serving.servers.openai_chat): messages in, text out, any hosted API or server.

`build_judge(JudgeConfig, engine=None, prompt=None)` picks one: an engine handed in (training starts one judge actor
and every rollout worker wraps it) wins; else backend `openai` builds a client of `urls[0]`; else the
engine backends build an engine with serving.factory (`embedded` loads the model in this process).

Failures are never verdicts: an unparseable reply is a verdict of None (the judge model's fault, scored 0),
but a transport failure or a call slower than `timeout_s` raises, so the episode counts as lost
infrastructure work rather than a wrong answer. Identical judgements running at the same time (a GRPO group
often repeats an answer) share one LLM call. `stats()` gives counters for metrics (`judge/calls`,
`judge/cache_hits`, `judge/unparsed`, ...); `describe()` gives what a run records as judge.json.

The prompt is pluggable: any object with `name`, `version`, `render(question, golds, prediction) -> messages`
and `parse(text) -> bool | None` (the `JudgePromptLike` protocol; eval/judges.py holds the benchmarks'
published judge prompts) replaces the built-in one above. Its `version` enters the cache key, so verdicts
of different prompts never mix; `describe()` records its name, version and text. The built-in prompt and
its parser, the protocol, the Verdict record and the cache are in agent/verdicts.py.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.config import JudgeConfig
from agent.verdicts import (
    JUDGE_PROMPT,
    JUDGE_PROMPT_VERSION,
    JUDGE_SYSTEM,
    RAW_WITHHELD,
    JudgePromptLike,
    Verdict,
    VerdictCache,
    parse_verdict,
)
from core.choices import check_choices
from core.log import get_logger, redact
from core.ranges import check_ranges
from serving.factory import chat_prompt_ids, is_chat_client
from serving.protocol import GenerateRequest, InferenceEngine, SamplingParams, generate_continuing

log = get_logger(__name__)


def _transport_urls(transport: Any) -> list[str]:
    """Server URLs a transport talks to, without credentials (best effort, for `describe`)."""
    from serving.servers.openai_chat import public_url

    url = getattr(transport, "base_url", None) or getattr(transport, "url", None)
    if isinstance(url, str):
        return [public_url(url)]
    servers = getattr(transport, "engines", None) or [getattr(s, "engine", None)
                                                       for s in getattr(transport, "_servers", [])]
    return [public_url(u) for u in (getattr(e, "url", None) for e in servers) if isinstance(u, str)]


class LLMJudge:
    """Judges predictions with an InferenceEngine or an OpenAIChatClient (see module docstring)."""

    def __init__(self, engine: Any, model_name: str, *, cache: VerdictCache | str | Path | None = None,
                 max_new_tokens: int = 256, temperature: float = 0.0, retries: int = 2, max_prediction_chars: int = 500,
                 timeout_s: float | None = None, backend: str | None = None, urls: list[str] | None = None,
                 owns_transport: bool = False, prompt: JudgePromptLike | None = None, keep_raw: bool = True):
        """`engine`: an InferenceEngine or an OpenAIChatClient. `model_name` enters the cache key. `timeout_s`
        bounds each LLM call (None: unbounded). `backend`/`urls` are only recorded by `describe()` (inferred
        when omitted). `owns_transport`: `aclose()` also closes the engine or client. `prompt`: a
        JudgePromptLike replacing the built-in prompt (which truncates the prediction to
        `max_prediction_chars`; a custom prompt applies its own rule). `keep_raw=False` (an encrypted suite):
        the judge's output, which often quotes the gold answer, is parsed and dropped: verdicts, cached or
        returned, carry `RAW_WITHHELD` instead, even those a plaintext run cached earlier."""
        self.engine = engine
        self.chat_client = is_chat_client(engine)
        self.model_name = model_name
        self._owns_cache = isinstance(cache, (str, Path))
        self.cache = VerdictCache(cache) if isinstance(cache, (str, Path)) else cache
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.retries = retries
        self.max_prediction_chars = max_prediction_chars
        self.timeout_s = timeout_s
        self.backend = backend or ("openai" if self.chat_client else getattr(engine, "backend", None)
                                   or type(engine).__name__)
        self.urls = list(urls) if urls is not None else _transport_urls(engine)
        self.owns_transport = owns_transport
        self.prompt = prompt
        self.keep_raw = keep_raw
        self.prompt_name = str(getattr(prompt, "name", "default")) if prompt is not None else "default"
        self.prompt_version = str(prompt.version) if prompt is not None else JUDGE_PROMPT_VERSION
        self.counters = {"judgements": 0, "calls": 0, "cache_hits": 0, "shared": 0, "unparsed": 0, "errors": 0}
        self._inflight: dict[str, asyncio.Future] = {}
        self._seconds = 0.0

    @property
    def calls(self) -> int:
        """LLM calls made so far (retries included; cache hits and shared calls excluded)."""
        return self.counters["calls"]

    @classmethod
    def from_config(cls, engine: Any, model_name: str, config: Any, prompt: JudgePromptLike | None = None) -> LLMJudge:
        """A judge over `engine` set up by `config`: a JudgeConfig or an AgentConfig (its `judge` section)."""
        cfg = getattr(config, "judge", config)
        return cls(engine, model_name, cache=_cache_path(getattr(cfg, "cache", "")),
                   max_new_tokens=getattr(cfg, "max_new_tokens", 256), temperature=getattr(cfg, "temperature", 0.0),
                   retries=getattr(cfg, "retries", 2), timeout_s=getattr(cfg, "timeout_s", None), prompt=prompt)

    # ---- prompts ---------------------------------------------------------------------------------

    def messages(self, question: str, golds: list[str], prediction: str) -> list[dict[str, str]]:
        """The messages of one judgement (the built-in prompt: system + user; a custom prompt: its own)."""
        if self.prompt is not None:
            return self.prompt.render(question, list(golds), prediction)
        user = JUDGE_PROMPT.format(question=question, gold=" | ".join(golds) or "(none)",
                                   prediction=prediction[: self.max_prediction_chars] or "(no answer)")
        return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]

    def prompt_ids(self, question: str, golds: list[str], prediction: str) -> list[int]:
        """The messages as token ids, through the engine tokenizer's chat template (engine transport only)."""
        return chat_prompt_ids(self.engine.tokenizer, self.messages(question, golds, prediction))

    # ---- judging ---------------------------------------------------------------------------------

    async def _complete(self, question: str, golds: list[str], prediction: str, attempt: int) -> str:
        """One LLM call (bounded by `timeout_s`) -> the judge's text."""
        temperature = self.temperature if attempt == 1 else max(self.temperature, 0.7)
        if self.chat_client:
            call = self.engine.chat(self.messages(question, golds, prediction), temperature=temperature,
                                    max_tokens=self.max_new_tokens, seed=attempt)
        else:
            sp = SamplingParams(temperature=temperature, max_new_tokens=self.max_new_tokens, seed=attempt)
            request = GenerateRequest(prompt_ids=self.prompt_ids(question, golds, prediction), sampling=sp)
            call = generate_continuing(self.engine, request)
        self.counters["calls"] += 1
        t0 = time.monotonic()
        try:
            out = await asyncio.wait_for(call, self.timeout_s) if self.timeout_s else await call
        except asyncio.TimeoutError:
            raise TimeoutError(f"judge call ({self.backend} {self.model_name}) timed out after "
                               f"{self.timeout_s:g}s") from None
        finally:
            self._seconds += time.monotonic() - t0
        if self.chat_client:
            return out
        return self.engine.tokenizer.decode(out.output_ids, skip_special_tokens=True)

    async def _judge_uncached(self, question: str, golds: list[str], prediction: str) -> Verdict:
        raw, verdict, attempt = "", None, 0
        for attempt in range(1, self.retries + 2):
            raw = await self._complete(question, golds, prediction, attempt)
            verdict = self.prompt.parse(raw) if self.prompt is not None else parse_verdict(raw)
            if verdict is not None:
                break
        if verdict is None:
            self.counters["unparsed"] += 1
        return Verdict(verdict, raw if self.keep_raw else RAW_WITHHELD, attempts=attempt)

    async def judge(self, question: str, golds: list[str], prediction: str) -> Verdict:
        """The verdict for one prediction: from the cache when known, shared with an identical judgement in
        flight, else from the LLM (cached only when parseable). Transport failures and timeouts raise."""
        golds = list(golds)
        self.counters["judgements"] += 1
        key = VerdictCache.key(self.model_name, question, golds, prediction, self.prompt_version)
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                self.counters["cache_hits"] += 1
                return hit if self.keep_raw else replace(hit, raw=RAW_WITHHELD)
        while (pending := self._inflight.get(key)) is not None:
            try:
                shared = await asyncio.shield(pending)
            except asyncio.CancelledError:
                if pending.cancelled():
                    continue  # the caller that made the call was cancelled: make it ourselves
                raise
            self.counters["shared"] += 1
            return replace(shared, cached=True)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            result = await self._judge_uncached(question, golds, prediction)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as e:
            self.counters["errors"] += 1
            future.set_exception(e)
            future.exception()  # retrieved: no "never retrieved" warning when nobody shared the call
            raise
        finally:
            self._inflight.pop(key, None)
        future.set_result(result)
        if self.cache is not None and result.correct is not None:
            self.cache.put(key, result)
        return result

    async def judge_many(self, items: list[tuple[str, list[str], str]], concurrency: int = 16) -> list[Verdict]:
        """Judge many (question, golds, prediction) triples with bounded concurrency."""
        sem = asyncio.Semaphore(concurrency)

        async def one(item: tuple[str, list[str], str]) -> Verdict:
            async with sem:
                return await self.judge(*item)

        return list(await asyncio.gather(*(one(i) for i in items)))

    # ---- records and lifecycle -------------------------------------------------------------------

    def stats(self) -> dict[str, float]:
        """Cumulative counters for metrics: judgements asked, LLM calls made (retries included), cache hits,
        judgements that shared an identical call in flight, verdicts left unparsed, judgements that raised;
        and `judge/latency_s`, the mean seconds of one LLM call."""
        out = {f"judge/{k}": float(v) for k, v in self.counters.items()}
        out["judge/latency_s"] = self._seconds / self.counters["calls"] if self.counters["calls"] else 0.0
        return out

    def describe(self) -> dict[str, Any]:
        """What a run records about its judge (judge.json): transport, model, prompt, sampling; no credentials."""
        return _description(
            backend=self.backend, model=self.model_name, urls=self.urls, max_new_tokens=self.max_new_tokens,
            temperature=self.temperature, retries=self.retries, timeout_s=self.timeout_s,
            cache=str(self.cache.path) if self.cache is not None else None,
            api_key_env=getattr(self.engine, "api_key_env", None) if self.chat_client else None,
            max_prediction_chars=self.max_prediction_chars, prompt=self.prompt)

    async def aclose(self) -> None:
        """Close the cache this judge opened and, when it owns it, the engine or client."""
        if self.owns_transport:
            close = getattr(self.engine, "aclose", None)
            if close is not None:
                await close()
            elif callable(getattr(self.engine, "close", None)):
                self.engine.close()
        if self._owns_cache and self.cache is not None:
            self.cache.close()
            self.cache = None


def _cache_path(cache: str) -> Path | None:
    """The verdict cache file of a `JudgeConfig.cache` value ("" -> `<cache dir>/judge.sqlite`, "none" -> no cache)."""
    if cache and cache.strip().lower() in ("none", "off"):
        return None
    if cache:
        return Path(cache).expanduser()
    from serving.models import cache_dir

    return cache_dir() / "judge.sqlite"


def _description(*, backend: str, model: str, urls: list[str], max_new_tokens: int, temperature: float,
                 retries: int, timeout_s: float | None, cache: str | None, api_key_env: str | None = None,
                 max_prediction_chars: int = 500, prompt: JudgePromptLike | None = None) -> dict[str, Any]:
    if prompt is None:
        name, version, system, template = "default", JUDGE_PROMPT_VERSION, JUDGE_SYSTEM, JUDGE_PROMPT
    else:  # a custom prompt applies its own truncation rule: record it, not the built-in one's
        name, version = str(getattr(prompt, "name", type(prompt).__name__)), str(prompt.version)
        system, template = getattr(prompt, "system", None), getattr(prompt, "template", None)
        max_prediction_chars = getattr(prompt, "max_prediction_chars", None)
    info: dict[str, Any] = {
        "backend": backend, "model": model, "urls": [redact(u) for u in urls], "prompt_name": name,
        "prompt_version": version, "system": system, "prompt_template": template, "max_new_tokens": max_new_tokens,
        "temperature": temperature, "retry_temperature": max(temperature, 0.7), "retries": retries,
        "max_prediction_chars": max_prediction_chars, "timeout_s": timeout_s, "cache": cache}
    if api_key_env is not None:
        info["api_key_env"] = api_key_env  # the variable's name, never its value
    return info


def describe_judge(cfg: JudgeConfig, prompt: JudgePromptLike | None = None) -> dict[str, Any]:
    """`LLMJudge.describe()` of the judge `build_judge(cfg, prompt=prompt)` would build, without building it (no
    model is loaded, no connection made, no key read): what the training driver writes as `<run>/judge.json`."""
    from serving.servers.openai_chat import api_base, public_url

    urls = [public_url(api_base(cfg.urls[0]))] if cfg.backend == "openai" and cfg.urls else \
        [public_url(u) for u in cfg.urls]
    path = _cache_path(cfg.cache)
    return _description(backend=cfg.backend, model=cfg.model, urls=urls, max_new_tokens=cfg.max_new_tokens,
                        temperature=cfg.temperature, retries=cfg.retries, timeout_s=cfg.timeout_s,
                        cache=str(path) if path is not None else None,
                        api_key_env=(cfg.api_key_env or "") if cfg.backend == "openai" else None, prompt=prompt)


def build_judge(cfg: JudgeConfig, engine: InferenceEngine | None = None, prompt: JudgePromptLike | None = None,
                keep_raw: bool = True) -> LLMJudge:
    """The judge a JudgeConfig describes (see module docstring); `engine` overrides the configured transport,
    `prompt` (a JudgePromptLike, e.g. one of eval.judges.JUDGE_PROMPTS) the built-in prompt; `keep_raw=False`
    keeps no judge output (see LLMJudge).

    An engine handed in is shared (not closed by `aclose`); a client or engine built here is owned.
    Raises ValueError for an unknown backend or an `openai` backend without `urls`."""
    common = dict(cache=_cache_path(cfg.cache), max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                  retries=cfg.retries, timeout_s=cfg.timeout_s, prompt=prompt, keep_raw=keep_raw)
    if engine is not None:
        return LLMJudge(engine, cfg.model, **common, backend=cfg.backend, owns_transport=False)
    check_choices(cfg, "agent.judge")
    check_ranges(cfg, "agent.judge")
    from serving.backends import ENGINE_BACKENDS

    ENGINE_BACKENDS.check(cfg.backend, ("openai",), key="agent.judge.backend")
    from serving.factory import build_llm
    from serving.servers.openai_chat import public_url

    built = build_llm(cfg.backend, cfg.model, list(cfg.urls), api_key_env=cfg.api_key_env, timeout_s=cfg.timeout_s,
                      what="agent.judge")
    urls = [public_url(built.base_url)] if cfg.backend == "openai" else [public_url(u) for u in cfg.urls]
    return LLMJudge(built, cfg.model, **common, backend=cfg.backend, urls=urls, owns_transport=True)


def judge_info(verdict: Verdict) -> dict[str, Any]:
    """What a trajectory's reward_info records about a verdict."""
    return {"judge": verdict.correct, "judge_parsed": verdict.correct is not None, "judge_cached": verdict.cached,
            "judge_attempts": verdict.attempts, "judge_raw": verdict.raw[-300:]}
