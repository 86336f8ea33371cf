"""Failures are never training data: a group with an `engine_error`/`engine_abort`/`agent_error` episode
is requeued (a bounded number of runs, then skipped) and never consumed; a run whose groups keep
failing stops with the error instead of admitting questions forever. The workers here are plain
objects with the rollout worker's `run_group.remote(...)` shape (the controller only awaits it)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from agent.qa import QAItem
from agent.trajectory import Segment, Trajectory
from trainer.buffer import GroupBuffer
from trainer.controller import INFRA_STOPS, RolloutController
from trainer.data import QuestionStream
from trainer.ledger import RolloutLedger
from trainer.staleness import StalenessController


def _traj(qid: str, reward: float, stop: str) -> Trajectory:
    seg = Segment()
    seg.append_prompt([1, 2, 3])
    seg.append_generated([7, 8], [-0.5, -0.25], [0, 0])
    return Trajectory(question_id=qid, question="Q?", gold=["x"], segments=[seg], reward=reward, stop_reason=stop,
                      meta={"error": "ConnectError: engine down"} if stop in INFRA_STOPS else {})


class Worker:
    """`broken(question_id, run) -> stop reason of episode 0` ('' for a normal group)."""

    def __init__(self, broken):
        self.broken, self.runs = broken, {}
        self.run_group = SimpleNamespace(remote=self._remote)

    def _remote(self, question, group_id, n, seed):
        run = self.runs[question.id] = self.runs.get(question.id, 0) + 1

        async def go():
            await asyncio.sleep(0)
            stop = self.broken(question.id, run)
            return [_traj(question.id, float(i % 2), stop if i == 0 and stop else "answered") for i in range(n)]
        return asyncio.ensure_future(go())


def _controller(tmp_path, broken, n_questions=6, **kw):
    items = [QAItem(id=f"q{i}", question=f"Q{i}?", answers=["x"]) for i in range(n_questions)]
    worker = Worker(broken)
    ctl = RolloutController(stream=QuestionStream(items, seed=0), workers=[worker],
                            staleness=StalenessController(2, 2, 2, 8), buffer=GroupBuffer(), group_size=2,
                            filter_groups="none", ledger=tmp_path / "rollouts.jsonl", **kw)
    return ctl, worker


def _ledger(tmp_path):
    return RolloutLedger(tmp_path / "rollouts.jsonl").read()


async def _consume(ctl, steps: int, batch: int = 2) -> list:
    ctl.start()
    groups = []
    try:
        for step in range(steps):
            groups += await asyncio.wait_for(ctl.next_batch(batch, step, step), 30)
            ctl.set_version(step + 1)
    finally:
        ctl._paused = True
        ctl._task.cancel()
    return groups


def test_failed_group_is_requeued_and_never_consumed(tmp_path):
    ctl, worker = _controller(tmp_path, lambda q, run: "engine_error" if q == "q1" and run <= 2 else "",
                              max_question_attempts=3)
    groups = asyncio.run(_consume(ctl, steps=3))
    assert all(t.stop_reason not in INFRA_STOPS for g in groups for t in g.trajectories)
    failed = [e for e in _ledger(tmp_path) if e["event"] == "failed"]
    assert [ctl.stream.item(e["key"]).id for e in failed] == ["q1", "q1"] and all(e["requeued"] for e in failed)
    assert "engine_error: ConnectError: engine down" in failed[0]["error"]
    assert worker.runs["q1"] == 3 and ctl.stats["failed"] == 2 and ctl.stats["skipped"] == 0
    assert "q1" in {g.question_id for g in groups}  # its third run succeeded and was trained on


def test_question_that_always_fails_is_skipped_after_its_attempts(tmp_path):
    ctl, worker = _controller(tmp_path, lambda q, run: "agent_error" if q == "q0" else "", max_question_attempts=2)
    groups = asyncio.run(_consume(ctl, steps=3))
    assert "q0" not in {g.question_id for g in groups}
    key = next(e["key"] for e in _ledger(tmp_path) if e["event"] == "skip")
    assert ctl.stream.item(key).id == "q0" and ctl.stats["skipped"] >= 1
    events = [(e["event"], e.get("requeued")) for e in _ledger(tmp_path) if e.get("key") == key]
    assert events.count(("failed", True)) == 1 and ("failed", False) in events and ("skip", None) in events


def test_every_group_failing_stops_the_run_with_the_error(tmp_path):
    ctl, _ = _controller(tmp_path, lambda q, run: "engine_abort", max_consecutive_failures=5)
    with pytest.raises(RuntimeError, match=r"5 rollout groups failed in a row .* ended in engine_abort"):
        asyncio.run(_consume(ctl, steps=1))


def test_the_ledger_reads_around_a_torn_last_line_without_cutting_it(tmp_path):
    ledger = RolloutLedger(tmp_path / "rollouts.jsonl")
    assert ledger.read() == []
    ledger.record("admit", key="q1", v=0)
    ledger.record("accept", key="q1", rewards=[1.0, 0.0])
    with ledger.path.open("a") as f:  # a writer killed mid-line (or still writing)
        f.write('{"event": "adm')
    assert [(e["event"], e["key"]) for e in ledger.read()] == [("admit", "q1"), ("accept", "q1")]
    assert ledger.path.read_text().endswith('{"event": "adm')  # never truncated: a run may be writing it
    RolloutLedger(None).record("admit", key="q2")  # no file: events are dropped
