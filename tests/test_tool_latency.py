"""Simulated web latency is drawn per (seed, episode, tool, call): two benchmark arms that run the same
episodes draw the same delays, whichever worker runs them and in whatever order."""

from __future__ import annotations

import asyncio

from tools.latency import LatencyTool, begin_episode
from tools.protocol import Observation


class Echo:
    name, schema = "search", {}

    async def __call__(self, args):
        return Observation(text=str(args))


async def _episode(tool: LatencyTool, episode_id: str, calls: int, log: dict) -> None:
    begin_episode(episode_id)
    for _ in range(calls):
        log.setdefault(episode_id, []).append(tool.draw())
        await asyncio.sleep(0)  # interleave with the other episodes


def _arm(order: list[str], worker_seed_noise: int) -> dict:
    """One arm: one tool instance (as in one rollout worker) running episodes concurrently in `order`."""
    tool = LatencyTool(Echo(), median_s=0.5, p99_s=5.0, seed=7)
    if worker_seed_noise:  # the fallback stream's position must not matter
        tool.rng.random()
    log: dict = {}

    async def main():
        await asyncio.gather(*(_episode(tool, e, 3, log) for e in order))
    asyncio.run(main())
    return log


def test_same_episodes_draw_the_same_delays_in_any_order():
    a = _arm(["q1#0/0", "q1#0/1", "q2#0/0"], 0)
    b = _arm(["q2#0/0", "q1#0/1", "q1#0/0"], 1)
    assert a == b
    assert len({d for draws in a.values() for d in draws}) == 9  # distinct draws per episode and call
    c = LatencyTool(Echo(), median_s=0.5, p99_s=5.0, seed=8)
    other: dict = {}

    async def one():
        await _episode(c, "q1#0/0", 3, other)
    asyncio.run(one())
    assert other["q1#0/0"] != a["q1#0/0"]  # the run seed still matters


def test_delay_is_lognormal_with_the_configured_median_and_p99():
    tool = LatencyTool(Echo(), median_s=0.5, p99_s=5.0, seed=1)
    log: dict = {}

    async def main():
        await asyncio.gather(*(_episode(tool, f"e{i}", 1, log) for i in range(4000)))
    asyncio.run(main())
    import math

    delays = sorted(math.exp(tool.mu + tool.sigma * z[0]) for z in log.values())
    assert abs(delays[len(delays) // 2] - 0.5) < 0.05
    assert abs(delays[int(0.99 * len(delays))] - 5.0) < 1.2
