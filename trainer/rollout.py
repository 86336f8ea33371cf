"""Rollout workers: Ray actors that run many agent episodes at once on asyncio.

A worker holds an engine client (an EngineProxy over the engine actors: embedded engines, or the
one actor that holds the client of remote vLLM/SGLang servers) and the tools (`tools.factory.build_tools`). The
controller hands it one group at a time: G episodes of the same question, run concurrently with the
same agent code that evaluation and the demo use (`agent.loop.run_episode`). A worker keeps no state
the run depends on: if it crashes, Ray restarts it and the controller re-runs its lost groups.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import time
from dataclasses import replace
from typing import Any

from agent.trajectory import Trajectory
from tools.protocol import Observation


class LatencyTool:
    """Wraps a tool with log-normal extra latency, like a web API (median m, 99th percentile p99).

    delay = exp(mu + sigma z), z ~ N(0, 1), mu = ln m, sigma = ln(p99 / m) / 2.326 (the 99% z-score)."""

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


def _tools_by_name(tools: Any) -> dict[str, Any]:
    return dict(tools) if isinstance(tools, dict) else {t.name: t for t in tools}


class RolloutWorker:
    """Ray actor body (created with `ray.remote(...)(RolloutWorker)` in `start_rollout_workers`)."""

    def __init__(self, cfg: Any, engine_handles: list[Any], index: int = 0, threads: int = 1):
        import torch

        torch.set_num_threads(max(1, threads))
        self.cfg, self.index = cfg, index
        self.engine: Any = None
        self.tools: Any = None
        self._handles = engine_handles
        self._slots: asyncio.Semaphore | None = None

    def _setup(self) -> None:
        if self.engine is not None:
            return
        from tools.factory import build_tools
        from trainer.engine_actor import EngineProxy

        self.engine = EngineProxy(self._handles, self.cfg.engine.model)
        tools = build_tools(self.cfg.tools)
        t = self.cfg.train
        if t.tool_latency_median_s > 0:
            named = _tools_by_name(tools)
            wrapped = {n: LatencyTool(tool, t.tool_latency_median_s, t.tool_latency_p99_s,
                                      seed=hash((self.index, n, os.getpid())) & 0xFFFF) for n, tool in named.items()}
            tools = wrapped if isinstance(tools, dict) else list(wrapped.values())
        self.tools = tools

    async def run_group(self, question: Any, group_id: str, n: int, seed: int) -> list[Trajectory]:
        """G = n episodes of one question at the training temperature."""
        self._setup()
        return list(await asyncio.gather(*(
            self._episode(question, self.cfg.agent, f"{group_id}/{i}", seed + i, group_id) for i in range(n))))

    async def run_eval(self, questions: list[Any], seed: int, temperature: float,
                       indices: list[int] | None = None) -> list[Trajectory]:
        """One episode per question with the evaluation sampling settings; question k of the dev set
        is always sampled with seed `seed + k`, so every evaluation sees the same randomness."""
        self._setup()
        agent_cfg = replace(self.cfg.agent, temperature=temperature)
        ks = indices if indices is not None else list(range(len(questions)))
        return list(await asyncio.gather(*(
            self._episode(q, agent_cfg, f"eval-{seed}-{k}-{_qid(q)}-{_uid()}", seed + k, "eval")
            for k, q in zip(ks, questions, strict=True))))

    async def _episode(self, question: Any, agent_cfg: Any, request_id: str, seed: int, group_id: str) -> Trajectory:
        from agent.loop import run_episode

        if self._slots is None:
            self._slots = asyncio.Semaphore(max(1, self.cfg.train.worker_concurrency))
        async with self._slots:
            traj = await run_episode(question, self.engine, self.tools, agent_cfg, tokenizer=self.engine.tokenizer,
                                     request_id=request_id, seed=seed)
        traj.group_id = group_id
        traj.meta["worker"] = self.index
        return traj

    async def ready(self) -> int:
        """Build the engine client and tools now (index and encoder loads), so the first group is not slow."""
        self._setup()
        return os.getpid()

    def pid(self) -> int:
        return os.getpid()


def _uid() -> str:
    import uuid

    return uuid.uuid4().hex[:8]


def _qid(q: Any) -> str:
    return str(getattr(q, "id", "") or abs(hash(str(q))) % 10**8)


def start_rollout_workers(cfg: Any, engine_handles: list[Any], placement: dict[str, Any],
                          threads: int) -> list[Any]:
    """Create the rollout worker actors (restarted by Ray up to `train.worker_max_restarts` times)."""
    import ray

    cls = ray.remote(RolloutWorker)
    return [cls.options(max_concurrency=10_000, max_restarts=cfg.train.worker_max_restarts, max_task_retries=0,
                        **placement).remote(cfg, engine_handles, i, threads)
            for i in range(cfg.train.rollout_workers)]
