"""Workflows: the one episode contract that training, evaluation, QA synthesis and `hexsearch ask` run.

    workflow = make_workflow(cfg)                    # once per process: tools, reward, judge built here
    traj = await workflow.arun_episode(engine, item, seed=7, request_id="q1/0")

`Workflow.arun_episode(engine, item, *, seed, request_id) -> Trajectory` is the whole contract
(AReaL's `arun_episode`): the engine is any `serving.protocol.InferenceEngine` (an embedded engine,
a Ray engine proxy, a vLLM/SGLang client, a scripted engine in tests), the item a QA item (or a
question string) and the trajectory token-exact (agent.trajectory). Whoever runs episodes (Ray
rollout workers, the dev evaluation, `hexsearch ask`, evaluation and QA synthesis) builds a
workflow once with `make_workflow(cfg, **shared)` and calls only this method, concurrently.

`train.workflow` names the class: `search_agent` (SearchAgentWorkflow, below), `openai_agent` (any agent
program through an OpenAI-compatible endpoint, agent/openai_agent.py) or an import path
`package.module:Class` of a Workflow subclass, resolved where it is built (inside each Ray worker).
A subclass is constructed as `Class(cfg, **shared)`, where `cfg` is the whole HexConfig and
`shared` the process-wide resources the caller offers (`judge_engine`: an engine for the LLM
judge; `world_dir`: the offline world's folder; `worker_index`: which rollout worker); it passes
them on to `Workflow.__init__`.
"""

from __future__ import annotations

import asyncio
import copy
import zlib
from dataclasses import replace
from typing import Any

from agent.config import WorkflowConfig
from agent.events import EventFn
from agent.judge import build_judge
from agent.loop import Agent
from agent.rewards import resolve_reward
from agent.trajectory import Trajectory
from core.registry import ComponentError, Registry


class Workflow:
    """Base class of episode workflows (see the module docstring)."""

    def __init__(self, cfg: WorkflowConfig, **shared: Any):
        self.cfg = cfg
        self.shared = shared

    async def arun_episode(self, engine: Any, item: Any, *, seed: int | None = None,
                           request_id: str | None = None) -> Trajectory:
        """Play one episode of `item` on `engine` and return its scored trajectory; never raises for
        engine, tool or model failures (they are the trajectory's `stop_reason`)."""
        raise NotImplementedError

    def with_temperature(self, temperature: float) -> Workflow:
        """The same workflow sampling at `temperature` (the dev evaluation's greedy copy). The default is a
        shallow copy whose `cfg.agent.temperature` is replaced; resources stay shared."""
        other = copy.copy(self)
        other.cfg = replace(self.cfg, agent=replace(self.cfg.agent, temperature=temperature))
        return other

    def stats(self) -> dict[str, float]:
        """Counters under stable metric names (`tools/<name>/...`, `judge/...`), cumulative."""
        return {}

    async def aclose(self) -> None:
        """Release tools, servers and clients."""


WORKFLOWS = Registry("workflow", "train.workflow", builtins=("agent.openai_agent",))  # registers `openai_agent`
"""Workflows by name; `train.workflow` also takes an import path `package.module:Class`."""


def make_workflow(cfg: WorkflowConfig, **shared: Any) -> Workflow:
    """The workflow `cfg.train.workflow` names, built with `cls(cfg, **shared)`; `agent.program` or
    `agent.command` (bring your own agent) turn the default `search_agent` into `openai_agent`."""
    name = cfg.train.workflow
    agent_cfg = getattr(cfg, "agent", None)
    if name == "search_agent" and (getattr(agent_cfg, "program", "") or getattr(agent_cfg, "command", None)):
        name = "openai_agent"
    cls = WORKFLOWS.resolve(name)
    if not (isinstance(cls, type) and issubclass(cls, Workflow)):
        raise ComponentError(f"train.workflow: '{name}' is not a subclass of agent.workflow.Workflow")
    return cls(cfg, **shared)


@WORKFLOWS.register("search_agent")
class SearchAgentWorkflow(Workflow):
    """The search agent (agent.loop) with its tools, reward function and judge, owned for the process.

    The reward function (`agent.reward_fn`) is resolved when the workflow is built. The tools
    (`tools.factory.open_toolset`: built-ins, components, MCP servers) are opened by `setup()`, on the
    first episode, unless given; so is the judge for `reward_fn=judge` (`agent.judge`, over
    `shared["judge_engine"]` when the caller offers one, e.g. the training run's judge actor)."""

    def __init__(self, cfg: WorkflowConfig, *, tools: dict[str, Any] | None = None, judge: Any = None,
                 **shared: Any):
        super().__init__(cfg, **shared)
        self.tools = tools
        self.judge = judge
        self.reward_fn = resolve_reward(cfg.agent.reward_fn)
        self._owned: list[Any] = []  # what this workflow opened and must close
        self._agents: dict[int, Agent] = {}
        self._setup_lock: asyncio.Lock | None = None
        self._parent: SearchAgentWorkflow | None = None  # set on `with_temperature` copies

    async def setup(self) -> None:
        """Open the tools and the judge (idempotent; concurrent callers wait for the first)."""
        if self._parent is not None:  # a copy uses its parent's tools and judge
            await self._parent.setup()
            self.tools, self.judge = self._parent.tools, self._parent.judge
            return
        if self._setup_lock is None:
            self._setup_lock = asyncio.Lock()
        async with self._setup_lock:
            if self.tools is None:
                from tools.factory import open_toolset

                toolset = await open_toolset(self.cfg.tools, world_dir=self.shared.get("world_dir"))
                self._owned.append(toolset)
                self.tools = self._with_latency(dict(toolset))
            if self.judge is None and self.cfg.agent.reward_fn == "judge":
                self.judge = build_judge(self.cfg.agent.judge, engine=self.shared.get("judge_engine"))
                self._owned.append(self.judge)

    def _with_latency(self, tools: dict[str, Any]) -> dict[str, Any]:
        """Tools with `tools.latency_*` simulated web latency, drawn from (run seed, tool, episode, call) so
        that every run with the same seed draws the same delays for the same episodes (tools/latency.py)."""
        t = self.cfg.tools
        if t.latency_median_s <= 0:
            return tools
        from tools.latency import LatencyTool

        return {name: LatencyTool(tool, t.latency_median_s, t.latency_p99_s,
                                  seed=zlib.crc32(f"{self.cfg.run.seed}/{name}".encode()))
                for name, tool in tools.items()}

    def agent_for(self, engine: Any) -> Agent:
        """The Agent bound to `engine` (built once per engine: prompts, schemas, format, policy)."""
        agent = self._agents.get(id(engine))
        if agent is None or agent.engine is not engine:
            agent = Agent(engine, self.tools or {}, self.cfg.agent, judge=self.judge, reward_fn=self.reward_fn)
            self._agents[id(engine)] = agent
        return agent

    async def arun_episode(self, engine: Any, item: Any, *, seed: int | None = None, request_id: str | None = None,
                           on_event: EventFn | None = None) -> Trajectory:
        """One episode (see Workflow); `on_event` receives live events (the `hexsearch ask` trace)."""
        from tools.latency import begin_episode

        await self.setup()
        begin_episode(request_id or "")  # simulated tool latency is drawn per (episode, call), not per process
        return await self.agent_for(engine).run(item, request_id=request_id, seed=seed, on_event=on_event)

    def with_temperature(self, temperature: float) -> SearchAgentWorkflow:
        other: SearchAgentWorkflow = super().with_temperature(temperature)  # type: ignore[assignment]
        other._agents, other._owned, other._parent = {}, [], self  # agents hold the sampling config
        return other

    def stats(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for tool in (self.tools or {}).values():
            stats = getattr(tool, "stats", None)
            if callable(stats):
                out.update(stats())
        judge_stats = getattr(self.judge, "stats", None)
        if callable(judge_stats):
            out.update(judge_stats())
        return out

    async def aclose(self) -> None:
        for obj in reversed(self._owned):
            await obj.aclose()
        self._owned.clear()
