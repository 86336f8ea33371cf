"""LatencyTool: a tool with web-API-like extra latency (the training benchmarks' simulated web).

    delay = exp(mu + sigma z), z ~ N(0, 1), mu = ln m, sigma = ln(p99 / m) / 2.326 (the 99% z-score)

so the delay is log-normal with median m and 99th percentile p99. Inside an episode (`begin_episode`, which
the workflow calls with the episode's request id) the n-th call of a tool draws z from (seed, request id,
tool, n) alone: two runs, or two benchmark arms, that run the same questions draw the same delays for
them, whatever process, worker or order they run in. Calls outside an episode use a seeded stream.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from contextvars import ContextVar
from typing import Any

from tools.protocol import Observation

_EPISODE: ContextVar[tuple[str, dict[str, int]] | None] = ContextVar("hexsearch_latency_episode", default=None)


def begin_episode(episode_id: str) -> None:
    """The tool calls of this asyncio task (and the tasks it starts) belong to episode `episode_id`."""
    _EPISODE.set((episode_id, {}))


class LatencyTool:
    """Wraps a tool with log-normal extra latency (median `median_s`, 99th percentile `p99_s`)."""

    def __init__(self, inner: Any, median_s: float, p99_s: float, seed: int = 0):
        self.inner, self.name, self.schema = inner, inner.name, inner.schema
        self.mu = math.log(median_s)
        self.sigma = max(0.0, math.log(max(p99_s, median_s) / median_s) / 2.326)
        self.seed, self.rng = seed, random.Random(seed)

    def draw(self) -> float:
        """z for this call (see the module docstring)."""
        episode = _EPISODE.get()
        if episode is None:
            return self.rng.gauss(0.0, 1.0)
        episode_id, calls = episode
        n = calls[self.name] = calls.get(self.name, 0) + 1
        return random.Random(f"{self.seed}/{episode_id}/{self.name}/{n}").gauss(0.0, 1.0)

    async def __call__(self, args: dict[str, Any]) -> Observation:
        delay = math.exp(self.mu + self.sigma * self.draw())
        t0 = time.perf_counter()
        await asyncio.sleep(delay)
        obs = await self.inner(args)
        obs.latency_s = time.perf_counter() - t0
        return obs

    def stats(self) -> dict[str, float]:
        stats = getattr(self.inner, "stats", None)
        return stats() if callable(stats) else {}

    async def aclose(self) -> None:
        close = getattr(self.inner, "aclose", None)
        if close is not None:
            await close()
