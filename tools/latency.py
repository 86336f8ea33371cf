"""LatencyTool: a tool with web-API-like extra latency (the training benchmarks' simulated web).

    delay = exp(mu + sigma z), z ~ N(0, 1), mu = ln m, sigma = ln(p99 / m) / 2.326 (the 99% z-score)

so the delay is log-normal with median m and 99th percentile p99. The draws come from a seeded
stream, so two runs (or two benchmark arms) with the same seed draw the same latencies.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from typing import Any

from tools.protocol import Observation


class LatencyTool:
    """Wraps a tool with log-normal extra latency (median `median_s`, 99th percentile `p99_s`)."""

    def __init__(self, inner: Any, median_s: float, p99_s: float, seed: int = 0):
        self.inner, self.name, self.schema = inner, inner.name, inner.schema
        self.mu = math.log(median_s)
        self.sigma = max(0.0, math.log(max(p99_s, median_s) / median_s) / 2.326)
        self.rng = random.Random(seed)

    async def __call__(self, args: dict[str, Any]) -> Observation:
        delay = math.exp(self.mu + self.sigma * self.rng.gauss(0.0, 1.0))
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
