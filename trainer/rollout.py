"""Rollout workers: Ray actors that run many episodes at once on asyncio, through one workflow.

A worker holds an engine client (an EngineProxy over the engine actors: embedded engines, or the
one actor that holds the client of remote vLLM/SGLang servers) and one workflow
(`agent.workflow.make_workflow(cfg)`, `train.workflow`), built in the worker so that import-path
components resolve on the node that runs them. The controller hands it one group at a time: G
episodes of the same question, each `workflow.arun_episode(engine, item, seed=..., request_id=...)`,
the same call evaluation and `hexsearch ask` make. A worker keeps no state the run depends on: if
it crashes, Ray restarts it and the controller re-runs its lost groups.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from agent.trajectory import Trajectory
from trainer.config import FullConfig


class RolloutWorker:
    """Ray actor body (created with `ray.remote(...)(RolloutWorker)` in `start_rollout_workers`)."""

    def __init__(self, cfg: FullConfig, engine_names: list[str], index: int = 0, threads: int = 1,
                 judge_names: list[str] | None = None):
        import torch

        torch.set_num_threads(max(1, threads))
        self.cfg, self.index = cfg, index
        self.engine: Any = None
        self.workflow: Any = None
        self._eval_workflows: dict[float, Any] = {}
        self._engine_names, self._judge_names = list(engine_names), list(judge_names or [])  # named actors
        self._slots = asyncio.Semaphore(max(1, cfg.train.worker_concurrency))

    async def _setup(self) -> None:
        if self.workflow is not None:
            return
        from agent.workflow import make_workflow
        from trainer.engine_actor import EngineProxy, lookup_engine_actors

        self.engine = EngineProxy(lookup_engine_actors(self._engine_names), self.cfg.engine.model)
        shared: dict[str, Any] = {"worker_index": self.index}
        if self._judge_names:
            shared["judge_engine"] = EngineProxy(lookup_engine_actors(self._judge_names), self.cfg.agent.judge.model)
        workflow = make_workflow(self.cfg, **shared)
        setup = getattr(workflow, "setup", None)
        if setup is not None:
            await setup()  # open tools, MCP servers and the judge before the first group
        self.workflow = workflow

    async def run_group(self, question: Any, group_id: str, n: int, seed: int) -> list[Trajectory]:
        """G = n episodes of one question at the training temperature."""
        await self._setup()
        return list(await asyncio.gather(*(
            self._episode(self.workflow, question, f"{group_id}/{i}", seed + i, group_id) for i in range(n))))

    async def run_eval(self, questions: list[Any], seed: int, temperature: float,
                       indices: list[int] | None = None) -> list[Trajectory]:
        """One episode per question with the evaluation sampling settings; question k of the dev set
        is always sampled with seed `seed + k`, so every evaluation sees the same randomness."""
        await self._setup()
        if temperature not in self._eval_workflows:
            self._eval_workflows[temperature] = self.workflow.with_temperature(temperature)
        workflow = self._eval_workflows[temperature]
        ks = indices if indices is not None else list(range(len(questions)))
        return list(await asyncio.gather(*(
            self._episode(workflow, q, f"eval-{seed}-{k}-{_qid(q)}-{_uid()}", seed + k, "eval")
            for k, q in zip(ks, questions, strict=True))))

    async def _episode(self, workflow: Any, question: Any, request_id: str, seed: int, group_id: str) -> Trajectory:
        async with self._slots:
            traj = await workflow.arun_episode(self.engine, question, seed=seed, request_id=request_id)
        traj.group_id = group_id
        traj.meta["worker"] = self.index
        return traj

    async def stats(self) -> dict[str, float]:
        """The workflow's cumulative counters (`tools/...`, `judge/...`)."""
        return self.workflow.stats() if self.workflow is not None else {}

    async def ready(self) -> int:
        """Build the engine client and the workflow now (index and encoder loads), so the first group is not slow."""
        await self._setup()
        return os.getpid()

    def pid(self) -> int:
        return os.getpid()


def _uid() -> str:
    import uuid

    return uuid.uuid4().hex[:8]


def _qid(q: Any) -> str:
    return str(getattr(q, "id", "") or abs(hash(str(q))) % 10**8)


def start_rollout_workers(cfg: FullConfig, engine_names: list[str], placement: dict[str, Any],
                          threads: int, judge_names: list[str] | None = None) -> list[Any]:
    """Create the rollout worker actors (restarted by Ray up to `train.worker_max_restarts` times). They reach
    the engine (and judge) actors by name (`trainer.engine_actor.engine_actor_names`), so a restarted worker
    finds them again without constructor arguments held in Ray's object store."""
    import ray

    cls = ray.remote(RolloutWorker)
    return [cls.options(max_concurrency=10_000, max_restarts=cfg.train.worker_max_restarts, max_task_retries=0,
                        **placement).remote(cfg, engine_names, i, threads, judge_names)
            for i in range(cfg.train.rollout_workers)]
