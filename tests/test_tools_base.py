"""BaseTool + ToolCache: retries with backoff (Retry-After honoured), timeouts, concurrency, cache, never raises."""

from __future__ import annotations

import asyncio
import email.utils
import time
from typing import Any

import httpx
import pytest
from fixtures.web import FixtureWeb

from tools.base import (
    BaseTool,
    ToolError,
    ToolResult,
    TransientError,
    check_status,
    parse_retry_after,
    percentiles,
)
from tools.cache import ToolCache, cache_key
from tools.protocol import Tool


class GetTool(BaseTool):
    """A minimal real tool: GET a path on a server and return the body length."""

    name = "get"
    description = "GET a path."
    parameters = {"type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "integer"}},
                  "required": ["path"]}

    def __init__(self, base_url: str, **kw: Any):
        super().__init__(**kw)
        self.base_url = base_url
        self.in_flight = 0
        self.max_in_flight = 0

    async def run(self, args: dict[str, Any]) -> ToolResult:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                resp = await client.get(self.base_url + args["path"])
            check_status(resp)
            return ToolResult({"bytes": len(resp.content)}, cost=0.01)
        finally:
            self.in_flight -= 1

    def render(self, data: Any, args: dict[str, Any]) -> str:
        return f"{args['path']}: {data['bytes']} bytes"


@pytest.fixture(scope="module")
def web():
    with FixtureWeb() as server:
        yield server


def tool(web, **kw) -> GetTool:
    kw.setdefault("backoff_initial_s", 0.01)
    kw.setdefault("backoff_max_s", 0.05)
    return GetTool(web.base_url, **kw)


def test_schema_and_protocol(web):
    t = tool(web)
    assert isinstance(t, Tool)
    assert t.schema["type"] == "function" and t.schema["function"]["name"] == "get"
    assert t.schema["function"]["parameters"]["required"] == ["path"]


async def test_transient_5xx_is_retried_until_success(web):
    t = tool(web, retries=3)
    obs = await t({"path": "/flaky/base1?fail=2&code=502"})
    assert obs.ok and obs.meta["attempts"] == 3 and obs.cost == pytest.approx(0.01)
    assert web.hits["/flaky/base1"] == 3
    assert t.counters["retries"] == 2


async def test_retries_exhausted_gives_error_observation(web):
    t = tool(web, retries=2)
    obs = await t({"path": "/status/503"})
    assert not obs.ok and obs.error == "HTTP 503" and "[get failed]" in obs.text
    assert web.hits["/status/503"] == 3


async def test_permanent_4xx_is_not_retried(web):
    t = tool(web, retries=3)
    obs = await t({"path": "/status/404"})
    assert obs.error == "HTTP 404"
    assert web.hits["/status/404"] == 1


async def test_429_retry_after_is_honoured(web):
    t = tool(web, retries=2, backoff_initial_s=10.0, backoff_max_s=10.0)  # exponential backoff would take 10 s
    waits: list[float] = []
    original = t._wait
    t._wait = lambda state: waits.append(original(state)) or waits[-1]  # type: ignore[method-assign]
    obs = await t({"path": "/ratelimited/base?n=1&after=0.2"})
    assert obs.ok and obs.meta["attempts"] == 2
    assert waits == [pytest.approx(0.2)]


def test_retry_after_parsing_and_cap():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("") is None and parse_retry_after("soon") is None
    future = email.utils.formatdate(time.time() + 120, usegmt=True)
    assert 100 < parse_retry_after(future) <= 121
    t = BaseTool(max_retry_after_s=5.0)

    class State:
        attempt_number = 1

        class outcome:  # noqa: N801
            @staticmethod
            def exception():
                return TransientError("429", retry_after=600)

    assert t._wait(State()) == 5.0  # a server cannot park us for 10 minutes


async def test_timeout_per_attempt(web):
    t = tool(web, timeout_s=0.3, retries=1)
    obs = await t({"path": "/slow?delay=3"})
    assert obs.error == "timed out after 0.3s"
    assert t.counters["timeouts"] == 2


async def test_bad_arguments_fail_without_running(web):
    t = tool(web)
    for args, msg in [({}, "missing required argument 'path'"), ({"path": 5}, "must be string"),
                      ({"path": "/plain", "n": "x"}, "must be integer"), ("nope", "must be an object")]:
        obs = await t(args)  # type: ignore[arg-type]
        assert msg in obs.error
    assert t.counters["calls"] == 4 and t.counters["errors"] == 4


async def test_unexpected_exception_becomes_error_observation():
    class Broken(BaseTool):
        name = "broken"

        async def run(self, args):
            raise KeyError("boom")

    obs = await Broken()({})
    assert obs.error == "KeyError: 'boom'" and obs.meta["error_type"] == "KeyError"


async def test_error_messages_are_redacted(monkeypatch):
    monkeypatch.setenv("SERPER_API_KEY", "sk-very-secret-123")

    class Leaky(BaseTool):
        name = "leaky"

        async def run(self, args):
            raise ToolError("upstream said: bad key sk-very-secret-123")

    obs = await Leaky()({})
    assert "sk-very-secret-123" not in obs.error and "***" in obs.error


async def test_cancellation_propagates(web):
    t = tool(web)
    task = asyncio.create_task(t({"path": "/slow?delay=2"}))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_concurrency_limit(web):
    t = tool(web, max_concurrency=2)
    results = await asyncio.gather(*(t({"path": f"/slow?delay=0.2&i={i}"}) for i in range(6)))
    assert all(o.ok for o in results)
    assert t.max_in_flight == 2


async def test_cache_hit_skips_the_call_and_costs_nothing(web, tmp_path):
    cache = ToolCache(tmp_path / "c.sqlite", ttl_s=3600)
    t = tool(web, cache=cache)
    first = await t({"path": "/article"})
    hits = web.hits["/article"]
    second = await t({"path": "/article"})
    assert first.ok and not first.cached and first.cost > 0
    assert second.cached and second.cost == 0 and second.text == first.text and second.data == first.data
    assert web.hits["/article"] == hits
    assert cache.stats()["hits"] == 1 and t.counters["cache_hits"] == 1
    # persistent: a new cache object on the same file still has it
    again = await tool(web, cache=ToolCache(tmp_path / "c.sqlite")).__call__({"path": "/article"})
    assert again.cached


async def test_errors_are_not_cached(web, tmp_path):
    t = tool(web, cache=ToolCache(tmp_path / "c.sqlite"), retries=0)
    before = web.hits["/status/404"]
    await t({"path": "/status/404"})
    await t({"path": "/status/404"})
    assert web.hits["/status/404"] == before + 2


def test_cache_ttl_and_normalisation(tmp_path):
    cache = ToolCache(tmp_path / "c.sqlite", ttl_s=0.2)
    cache.put("search:x", {"query": "  veyra   lighthouse "}, {"v": 1})
    assert cache.get("search:x", {"query": "veyra lighthouse"}) == {"v": 1}
    assert cache.get("search:y", {"query": "veyra lighthouse"}) is None  # namespaces are separate
    time.sleep(0.3)
    assert cache.get("search:x", {"query": "veyra lighthouse"}) is None
    assert cache.stats()["expired"] == 1
    assert cache_key("a", {"b": 1, "c": [1, 2]}) == cache_key("a", {"c": [1, 2], "b": 1})
    assert cache_key("a", {"c": [1, 2]}) != cache_key("a", {"c": [2, 1]})


def test_stats_use_stable_metric_names(web):
    t = tool(web)
    asyncio.run(t({"path": "/plain"}))
    s = t.stats()
    assert s["tools/get/calls"] == 1 and s["tools/get/ok"] == 1 and s["tools/get/cost"] == pytest.approx(0.01)
    assert s["tools/get/latency_p50_s"] > 0
    assert percentiles([3, 1, 2, 4], (0.5, 1.0)) == [2, 4]


async def test_a_call_waiting_to_retry_frees_its_concurrency_slot():
    """max_concurrency=1: while call A sleeps before its retry (Retry-After), call B runs and finishes."""
    order: list[str] = []

    class Flaky(BaseTool):
        name = "flaky"
        description = "fails once with Retry-After for 'a'"
        parameters = {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}

        def __init__(self, **kw: Any):
            super().__init__(**kw)
            self.failed = False

        async def run(self, args: dict[str, Any]) -> ToolResult:
            if args["key"] == "a" and not self.failed:
                self.failed = True
                raise TransientError("429 slow down", retry_after=0.5)
            order.append(args["key"])
            return ToolResult(data=args["key"])

    t = Flaky(max_concurrency=1, retries=2)

    async def b_after_a_started():
        await asyncio.sleep(0.05)
        return await t({"key": "b"})

    a, b = await asyncio.gather(t({"key": "a"}), b_after_a_started())
    assert a.ok and b.ok and a.meta["attempts"] == 2
    assert order == ["b", "a"]  # b did not wait for a's backoff
