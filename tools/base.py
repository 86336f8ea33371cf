"""BaseTool: what every tool gets for free — timeout, concurrency limit, retries, cache, accounting.

A subclass declares `name`, `description`, `parameters` (JSON schema) and implements
`run(args) -> ToolResult` (raise `ToolError` for a permanent failure, `TransientError` for one
worth retrying) and `render(data, args) -> str` (the text the model sees). `__call__` wraps it:

    validate args -> cache lookup -> attempts, each [semaphore] + per-attempt timeout
    -> retry on TransientError / timeouts / network errors (exponential backoff with jitter,
       or the server's Retry-After when it sent one) -> cache store -> Observation

Backoff before retry n (n = 1, 2, ...): `min(backoff_max, backoff_initial * 2**(n-1)) * U(0.5, 1)`,
replaced by `min(Retry-After, max_retry_after)` when a 429/503 carried one. The worst-case
wall time of a call is `(retries + 1) * timeout_s` plus the backoff sleeps.

`__call__` never raises for tool-side failures: it returns an Observation with `error` set, so an
agent episode is never lost to a flaky website. Only cancellation propagates.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from core.log import get_logger, redact
from core.retry import parse_retry_after  # noqa: F401 - re-exported for tool authors
from tools.cache import ToolCache
from tools.protocol import Observation
from tools.urlguard import HostNotFound, UrlRefused

log = get_logger(__name__)


class ToolError(Exception):
    """A permanent tool failure (bad arguments, refused URL, 404): not retried. One-line message."""


class TransientError(ToolError):
    """A failure worth retrying (429, 5xx, timeouts, dropped connections)."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


@dataclass
class ToolResult:
    """What `run` returns: structured data plus accounting; `render` turns data into text."""

    data: Any
    cost: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)


def check_status(resp: httpx.Response, what: str = "HTTP") -> None:
    """Raise TransientError for 408/425/429/5xx, ToolError for other 4xx; return for 2xx/3xx."""
    code = resp.status_code
    if code < 400:
        return
    if code in (408, 425, 429) or code >= 500:
        raise TransientError(f"{what} {code}", retry_after=parse_retry_after(resp.headers.get("Retry-After")))
    raise ToolError(f"{what} {code}")


def percentiles(values: Iterable[float], ps: Iterable[float]) -> list[float]:
    """Nearest-rank percentiles (p in [0, 1]) of `values`; zeros when empty."""
    data = sorted(values)
    if not data:
        return [0.0 for _ in ps]
    return [data[min(len(data) - 1, max(0, math.ceil(p * len(data)) - 1))] for p in ps]


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, TransientError | TimeoutError):
        return True
    if isinstance(exc, ToolError | UrlRefused | HostNotFound):
        return False
    return isinstance(exc, httpx.TimeoutException | httpx.NetworkError | httpx.RemoteProtocolError)


def describe_error(exc: BaseException, timeout_s: float) -> str:
    """One-line, secret-free description of a failure."""
    if isinstance(exc, TimeoutError):
        return f"timed out after {timeout_s:g}s"
    if isinstance(exc, UrlRefused | ToolError | HostNotFound):
        text = str(exc)
    elif isinstance(exc, httpx.HTTPError):
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    else:
        text = f"{type(exc).__name__}: {exc}"
    return redact(" ".join(text.split()))[:500]


class BaseTool:
    """Base class of all tools; see the module docstring for the call pipeline."""

    name: str = "tool"
    description: str = ""
    parameters: dict[str, Any] = {"type": "object", "properties": {}, "required": []}

    def __init__(self, *, timeout_s: float = 30.0, max_concurrency: int = 32, retries: int = 3,
                 cache: ToolCache | None = None, backoff_initial_s: float = 0.5, backoff_max_s: float = 8.0,
                 max_retry_after_s: float = 30.0):
        self.timeout_s = timeout_s
        self.retries = max(0, retries)
        self.cache = cache
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.max_retry_after_s = max_retry_after_s
        self._semaphore = asyncio.Semaphore(max(1, max_concurrency))
        self.counters = {"calls": 0, "ok": 0, "errors": 0, "cache_hits": 0, "retries": 0, "timeouts": 0}
        self.cost_total = 0.0
        self.latency_total_s = 0.0
        self._latencies: deque[float] = deque(maxlen=4096)

    @property
    def schema(self) -> dict[str, Any]:
        """OpenAI function schema."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}

    # -- hooks for subclasses -------------------------------------------------------------------
    def validate(self, args: dict[str, Any]) -> dict[str, Any]:
        """Check args against `parameters` (required keys, basic types); return the cleaned args."""
        if not isinstance(args, dict):
            raise ToolError(f"arguments must be an object, got {type(args).__name__}")
        props = self.parameters.get("properties", {})
        for key in self.parameters.get("required", []):
            if args.get(key) in (None, ""):
                raise ToolError(f"missing required argument '{key}'")
        types = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list}
        clean = {}
        for key, value in args.items():
            if key not in props:
                continue  # models add stray keys; ignore them rather than fail the call
            want = types.get(props[key].get("type", ""))
            if want is int and isinstance(value, str) and value.strip().lstrip("-").isdigit():
                value = int(value)
            if want and (not isinstance(value, want) or (want is int and isinstance(value, bool))):
                raise ToolError(f"argument '{key}' must be {props[key]['type']}, got {type(value).__name__}")
            clean[key] = value
        return clean

    def cache_namespace(self) -> str:
        """Cache namespace; include anything that changes results (provider, index identity)."""
        return self.name

    def cache_args(self, args: dict[str, Any]) -> dict[str, Any] | None:
        """Arguments that determine the cached result, or None to bypass the cache."""
        return args

    async def run(self, args: dict[str, Any]) -> ToolResult:
        raise NotImplementedError

    def render(self, data: Any, args: dict[str, Any]) -> str:
        """Text for the model from (possibly cached) data."""
        return str(data)

    async def aclose(self) -> None:
        """Release network clients and other resources."""

    # -- the pipeline ---------------------------------------------------------------------------
    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        retry_after = getattr(exc, "retry_after", None)
        if retry_after is not None:
            return min(float(retry_after), self.max_retry_after_s)
        base = min(self.backoff_max_s, self.backoff_initial_s * 2 ** (state.attempt_number - 1))
        return base * random.uniform(0.5, 1.0)

    def _before_sleep(self, state: RetryCallState) -> None:
        self.counters["retries"] += 1
        exc = state.outcome.exception() if state.outcome else None
        log.info("%s: retry %d after %s", self.name, state.attempt_number, exc and describe_error(exc, self.timeout_s))

    async def _attempts(self, args: dict[str, Any]) -> tuple[ToolResult, int]:
        attempts = 0
        retrying = AsyncRetrying(stop=stop_after_attempt(self.retries + 1), wait=self._wait,
                                 retry=retry_if_exception(_is_transient), before_sleep=self._before_sleep,
                                 reraise=True)
        async for attempt in retrying:
            with attempt:
                attempts += 1
                try:
                    async with self._semaphore:  # held per attempt: a call sleeping before a retry frees its slot
                        result = await asyncio.wait_for(self.run(args), self.timeout_s)
                except TimeoutError:
                    self.counters["timeouts"] += 1
                    raise
        return result, attempts

    async def __call__(self, args: dict[str, Any]) -> Observation:
        t0 = time.perf_counter()
        self.counters["calls"] += 1
        try:
            clean = self.validate(args)
            key_args = self.cache_args(clean)
            if self.cache is not None and key_args is not None:
                hit = self.cache.get(self.cache_namespace(), key_args)
                if hit is not None:
                    self.counters["cache_hits"] += 1
                    self.counters["ok"] += 1
                    return Observation(text=self.render(hit["data"], clean), data=hit["data"],
                                       latency_s=time.perf_counter() - t0, cost=0.0, cached=True,
                                       meta=dict(hit.get("meta", {}), original_cost=hit.get("cost", 0.0)))
            result, attempts = await self._attempts(clean)
            if self.cache is not None and key_args is not None:
                self.cache.put(self.cache_namespace(), key_args,
                               {"data": result.data, "cost": result.cost, "meta": result.meta})
            text = self.render(result.data, clean)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - tools never raise to the agent
            latency = time.perf_counter() - t0
            self._account(latency, 0.0)
            self.counters["errors"] += 1
            message = describe_error(exc, self.timeout_s)
            log.info("%s failed: %s", self.name, message)
            return Observation(text=f"[{self.name} failed] {message}", error=message, latency_s=latency,
                               meta={"error_type": type(exc).__name__})
        latency = time.perf_counter() - t0
        self._account(latency, result.cost)
        self.counters["ok"] += 1
        return Observation(text=text, data=result.data, latency_s=latency, cost=result.cost,
                           meta=dict(result.meta, attempts=attempts))

    def _account(self, latency: float, cost: float) -> None:
        self.latency_total_s += latency
        self.cost_total += cost
        self._latencies.append(latency)

    def stats(self) -> dict[str, float]:
        """Counters under stable metric names `tools/<name>/...`."""
        p50, p90 = percentiles(self._latencies, (0.5, 0.9))
        out: dict[str, float] = {f"tools/{self.name}/{k}": float(v) for k, v in self.counters.items()}
        out[f"tools/{self.name}/cost"] = self.cost_total
        out[f"tools/{self.name}/latency_p50_s"] = p50
        out[f"tools/{self.name}/latency_p90_s"] = p90
        out[f"tools/{self.name}/latency_mean_s"] = self.latency_total_s / max(1, self.counters["calls"])
        return out
