"""`train.workflow: openai_agent`: any agent program, trained and evaluated through an OpenAI-compatible endpoint.

    agent.program: my_agent:solve            # async def solve(base_url, api_key, item) -> str | (str, float)
    agent.command: [python, my_agent.py]     # OPENAI_BASE_URL / OPENAI_API_KEY in its environment

Each episode gets a key on the worker's recording endpoint (agent/openai_endpoint.py) and runs the program
once with `item = {"id", "question"}` (never the gold answers). A function is awaited in the worker's event
loop (a plain function runs in a thread); a command is started with a minimal environment (PATH, locale,
TMPDIR, `agent.command_env`, and the endpoint's URL and key), gets the item as one JSON line on stdin, and
its last stdout line is the answer. Every call the program makes is served by the run's engine and recorded;
the trajectory is built from the records (agent/openai_calls.py), so every trained token is one the engine
sampled, with its log-prob and weight version. The answer is scored by `agent.reward_fn`; a program that
returns `(answer, reward)` supplies the reward itself (the reward_fn's score stays in `reward_info`).

Failures: a program that raises, exits non-zero, runs past `agent.wall_clock_s` (it is killed) or never calls
the endpoint ends with stop reason `agent_error` (meta: `failure`, `error` with the stderr tail), which the
trainer never trains on and re-queues (trainer/controller.py INFRA_STOPS); a call the engine failed gives
`engine_error`. A program that spends `agent.max_turns` calls ends as `max_turns` (the policy's doing: trained).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import signal
import time
import traceback
import uuid
from typing import TYPE_CHECKING, Any

from agent.config import WorkflowConfig
from agent.episode_tools import as_item
from agent.judge import build_judge
from agent.openai_calls import EpisodeCalls, build_segments
from agent.rewards import resolve_reward, score_episode
from agent.trajectory import ToolCallRecord, Trajectory
from agent.workflow import WORKFLOWS, Workflow
from core.registry import ComponentError, import_object

if TYPE_CHECKING:  # the endpoint (FastAPI) is imported when an episode first needs it, not when configs load
    from agent.openai_endpoint import RecordingEndpoint

BASE_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TZ", "SYSTEMROOT")
"""Environment variables a command inherits (plus `agent.command_env`); nothing else of the worker's leaks."""
STDERR_TAIL = 2000
"""Characters of a failed program's stderr (or traceback) kept in the trajectory and the ledger."""


class ProgramFailed(Exception):
    """The program did not produce an answer; `failure` says how (raised, exit_code, wall_clock, bad_answer)."""

    def __init__(self, failure: str, error: str):
        super().__init__(error)
        self.failure = failure


def _answer(out: Any, who: str) -> tuple[str, float | None]:
    if isinstance(out, str):
        return out, None
    if (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], str) and isinstance(out[1], int | float)
            and not isinstance(out[1], bool)):
        return out[0], float(out[1])
    raise ProgramFailed("bad_answer", f"{who} returned {type(out).__name__}; it must return str or (str, float)")


@WORKFLOWS.register("openai_agent")
class OpenAIAgentWorkflow(Workflow):
    """See the module docstring."""

    def __init__(self, cfg: WorkflowConfig, *, judge: Any = None, **shared: Any):
        super().__init__(cfg, **shared)
        a = cfg.agent
        if bool(a.program) == bool(a.command):
            raise ComponentError("train.workflow=openai_agent needs exactly one of agent.program "
                                 "('package.module:function') and agent.command (a command line)")
        self.program = import_object(a.program, "agent program", "agent.program") if a.program else None
        if self.program is not None and not callable(self.program):
            raise ComponentError(f"agent.program: '{a.program}' is not a function")
        self.judge = judge
        self.reward_fn = resolve_reward(a.reward_fn)
        self.endpoint: RecordingEndpoint | None = None
        self._owned: list[Any] = []
        self.counters = {"openai_agent/episodes": 0.0, "openai_agent/failed": 0.0, "openai_agent/calls": 0.0,
                         "openai_agent/segment_splits": 0.0, "openai_agent/retokenized_calls": 0.0}

    async def setup(self) -> None:
        if self.judge is None and self.cfg.agent.reward_fn == "judge":
            self.judge = build_judge(self.cfg.agent.judge, engine=self.shared.get("judge_engine"))
            self._owned.append(self.judge)

    async def endpoint_for(self, engine: Any) -> RecordingEndpoint:
        """The process's recording endpoint (one per worker), serving in the running event loop."""
        if self.endpoint is None:
            from agent.openai_endpoint import RecordingEndpoint

            engine_cfg = getattr(self.cfg, "engine", None)
            self.endpoint = RecordingEndpoint(engine.tokenizer, getattr(engine_cfg, "model", None) or "policy")
        await self.endpoint.start()
        return self.endpoint

    async def arun_episode(self, engine: Any, item: Any, *, seed: int | None = None,
                           request_id: str | None = None, **_: Any) -> Trajectory:
        await self.setup()
        a = self.cfg.agent
        qid, question, golds, aug = as_item(item)
        endpoint = await self.endpoint_for(engine)
        limit = getattr(engine, "max_model_len", None)
        episode = EpisodeCalls(engine, request_id or uuid.uuid4().hex, seed,
                               {"temperature": a.temperature, "top_p": a.top_p, "top_k": a.top_k}, a.max_new_tokens,
                               min(a.max_context_tokens, limit) if isinstance(limit, int) else a.max_context_tokens,
                               a.max_turns)
        key = endpoint.open(episode)
        t0 = time.perf_counter()
        answer, own_reward, failure, error = None, None, "", ""
        try:
            answer, own_reward = await asyncio.wait_for(
                self.run_program(endpoint.base_url, key, {"id": qid, "question": question}), a.wall_clock_s)
        except asyncio.TimeoutError:
            failure, error = "wall_clock", f"the program ran past agent.wall_clock_s={a.wall_clock_s:g} and was killed"
        except ProgramFailed as e:
            failure, error = e.failure, str(e)
        finally:
            endpoint.close(key)
        if episode.budget_spent and failure in ("raised", "exit_code"):
            failure, error = "", ""  # the program stopped because its call budget ran out: the policy's doing
        if not failure and not episode.calls:
            failure, error = "no_calls", "the program never called the endpoint (OPENAI_BASE_URL / base_url)"
        traj = self.trajectory(episode, qid, question, golds, failure, error)
        traj.prediction = answer if not failure else None
        traj.timings = {"total": time.perf_counter() - t0, "llm": sum(c.latency_s for c in episode.calls), "tools": 0.0}
        if traj.stop_reason in ("answered", "no_answer", "max_turns"):
            await self.score(traj, golds, aug, own_reward)
        return traj

    async def run_program(self, base_url: str, key: str, item: dict[str, Any]) -> tuple[str, float | None]:
        if self.program is not None:
            try:
                if inspect.iscoroutinefunction(self.program):
                    out = await self.program(base_url, key, item)
                else:  # a blocking function would stall the endpoint, which serves in this event loop
                    out = await asyncio.to_thread(self.program, base_url, key, item)
            except (asyncio.CancelledError, ProgramFailed):
                raise
            except Exception as e:
                raise ProgramFailed("raised", f"{type(e).__name__}: {e}\n" + traceback.format_exc()[-STDERR_TAIL:]) \
                    from None
            return _answer(out, f"agent.program {self.cfg.agent.program}")
        return await self.run_command(base_url, key, item)

    async def run_command(self, base_url: str, key: str, item: dict[str, Any]) -> tuple[str, float | None]:
        a = self.cfg.agent
        env = {k: os.environ[k] for k in (*BASE_ENV, *a.command_env) if k in os.environ}
        env.update(OPENAI_BASE_URL=base_url, OPENAI_API_KEY=key)
        proc = await asyncio.create_subprocess_exec(
            *a.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env, cwd=a.command_cwd or None, start_new_session=True)
        try:
            out, err = await proc.communicate((json.dumps(item) + "\n").encode())
        finally:
            if proc.returncode is None:  # timed out or cancelled: the whole process group goes
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(Exception):
                    await asyncio.shield(proc.wait())
        tail = err.decode(errors="replace")[-STDERR_TAIL:]
        if proc.returncode != 0:
            raise ProgramFailed("exit_code", f"agent.command exited with code {proc.returncode}; stderr: {tail}")
        lines = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
        return (lines[-1].strip() if lines else ""), None

    def trajectory(self, episode: EpisodeCalls, qid: str, question: str, golds: list[str], failure: str,
                   error: str) -> Trajectory:
        segments, splits = build_segments(episode.calls)
        hows = [c.how for c in episode.calls]
        if failure:
            stop = "agent_error"
        elif episode.engine_error:
            stop, failure, error = "engine_error", "engine", episode.engine_error
        elif episode.budget_spent:
            stop = "max_turns"
        else:
            stop = "answered"
        traj = Trajectory(qid, question, gold=list(golds), segments=[s for s in segments if s.num_generated],
                          stop_reason=stop, num_turns=len(episode.calls))
        traj.tool_calls = [ToolCallRecord(turn=i, name=name, args=args if isinstance(args, dict) else {"raw": args})
                           for i, name, args in ((i, n, _json_args(a)) for i, n, a in episode.tool_calls)]
        program = self.cfg.agent.program or " ".join(self.cfg.agent.command)
        traj.meta = {"request_id": episode.request_id, "seed": episode.seed, "workflow": "openai_agent",
                     "program": program, "segment_splits": splits, "retokenized_calls": hows.count("retokenized"),
                     "generated_tokens": sum(len(c.output_ids) for c in episode.calls),
                     "turns": [{"turn": i, "kind": c.route, "how": c.how, "prompt_tokens": len(c.prompt_ids),
                                "new_tokens": len(c.output_ids), "finish": c.finish_reason,
                                "llm_s": round(c.latency_s, 6)} for i, c in enumerate(episode.calls)]}
        if failure:
            traj.meta.update(failure=failure, error=error[-STDERR_TAIL:])
        c = self.counters
        c["openai_agent/episodes"] += 1
        c["openai_agent/failed"] += bool(failure)
        c["openai_agent/calls"] += len(episode.calls)
        c["openai_agent/segment_splits"] += splits
        c["openai_agent/retokenized_calls"] += hows.count("retokenized")
        return traj

    async def score(self, traj: Trajectory, golds: list[str], aug: list[str], own_reward: float | None) -> None:
        if traj.stop_reason == "answered" and not (traj.prediction or "").strip():
            traj.stop_reason, traj.prediction = "no_answer", None
        try:
            traj.reward, traj.reward_info = await score_episode(traj, golds, aug, self.cfg.agent, True, self.judge,
                                                                self.reward_fn)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            traj.reward, traj.reward_info = 0.0, {"error": f"{type(e).__name__}: {e}"[:300]}
        if own_reward is not None:
            traj.reward_info.update(program_reward=own_reward, scored=traj.reward)
            traj.reward = own_reward

    def stats(self) -> dict[str, float]:
        out = dict(self.counters)
        if self.endpoint is not None:
            out["openai_agent/refused_keys"] = float(self.endpoint.stats["refused"])
        judge_stats = getattr(self.judge, "stats", None)
        if callable(judge_stats):
            out.update(judge_stats())
        return out

    async def aclose(self) -> None:
        if self.endpoint is not None:
            await self.endpoint.aclose()
        for obj in reversed(self._owned):
            await obj.aclose()
        self._owned.clear()


def _json_args(raw: Any) -> Any:
    try:
        return json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return raw
