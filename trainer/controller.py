"""The rollout controller: admits groups under the staleness rule and feeds the buffer.

It runs on the driver's asyncio loop. Admission: while `staleness.try_admit()` allows, take the
next question from the stream and send the group to the least busy rollout worker. Completion:

    worker returned          -> `reject` filter and no reward variance ? rejected : accepted (buffer)
    an episode ended in engine_error / engine_abort / agent_error
                             -> failed group: never trained on; the question is re-queued, at most
                                `max_question_attempts` runs in all, then skipped
    episode code raised      -> failed (the question is not retried: the error would repeat)
    worker died (Ray error)  -> lost: slot freed, question re-queued, run again on a restarted worker

`max_consecutive_failures` failed groups in a row stop the run with the last error (a bad agent config
fails every group; admitting questions forever would hide it).

Consumption (`next_batch`) takes the oldest accepted groups and refuses any whose oldest token is
more than max_staleness versions behind the learner (per-sample bound); a refused group frees its
slot and its question is re-run. Every event is appended to `rollouts.jsonl` (the ledger tests and post-mortems read).
"""

from __future__ import annotations

import asyncio
import zlib
from pathlib import Path
from typing import Any

from trainer.buffer import Group, GroupBuffer
from trainer.data import QuestionStream
from trainer.ledger import RolloutLedger
from trainer.staleness import StalenessController

LOST_ERRORS: tuple[type[BaseException], ...] = ()
INFRA_STOPS = frozenset({"engine_error", "engine_abort", "agent_error"})
"""Stop reasons that say the episode failed, not the policy: such an episode is never training data."""


def lost_errors() -> tuple[type[BaseException], ...]:
    """The Ray errors that mean an actor died or is restarting (its call is lost, not failed by its code)."""
    global LOST_ERRORS
    if not LOST_ERRORS:
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, WorkerCrashedError

        LOST_ERRORS = (RayActorError, ActorDiedError, ActorUnavailableError, WorkerCrashedError)
    return LOST_ERRORS


class RolloutController:
    def __init__(self, *, stream: QuestionStream, workers: list[Any], staleness: StalenessController,
                 buffer: GroupBuffer, group_size: int, filter_groups: str = "drop", seed: int = 0,
                 ledger: RolloutLedger | str | Path | None = None, max_worker_losses: int = 4, max_question_attempts: int = 3,
                 max_consecutive_failures: int = 20):
        self.stream, self.workers, self.staleness, self.buffer = stream, workers, staleness, buffer
        self.group_size, self.filter_groups, self.seed = group_size, filter_groups, seed
        self.ledger = ledger if isinstance(ledger, RolloutLedger) else RolloutLedger(ledger)
        self.in_flight: dict[str, tuple[int, asyncio.Task]] = {}
        self.load = [0] * len(workers)
        self.attempts: dict[str, int] = {}
        self.losses = [0] * len(workers)
        self.max_worker_losses = max_worker_losses
        self.max_question_attempts = max_question_attempts
        self.max_consecutive_failures = max_consecutive_failures
        self.failures_in_a_row = 0
        self.fatal: BaseException | None = None
        self.stats = {"accepted": 0, "rejected": 0, "lost": 0, "failed": 0, "skipped": 0, "refused": 0,
                      "gen_tokens": 0}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._paused = False

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._admit_loop())

    def pause(self) -> None:
        """Stop admitting new groups (in-flight ones continue)."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        self._wake.set()

    def set_version(self, version: int) -> None:
        self.staleness.set_version(version)
        self._wake.set()

    async def stop(self) -> None:
        """Stop admitting and cancel in-flight groups (their questions are requeued, never consumed)."""
        import ray

        self._paused = True
        if self._task:
            self._task.cancel()
        for key, (_, task) in list(self.in_flight.items()):
            ref = getattr(task, "ray_ref", None)
            if ref is not None:
                ray.cancel(ref)
            task.cancel()
            self.stream.requeue(key)
        self.in_flight.clear()

    def in_flight_keys(self) -> list[str]:
        return sorted(self.in_flight)

    # -- admission ---------------------------------------------------------------------------
    async def _admit_loop(self) -> None:
        while True:
            if self.fatal is not None:
                raise self.fatal
            while not self._paused and self.staleness.try_admit():
                key, question = self.stream.next()
                self._launch(key, question)
            self._wake.clear()
            await self._wake.wait()

    def _launch(self, key: str, question: Any) -> None:
        alive = [i for i in range(len(self.workers)) if self.losses[i] < self.max_worker_losses]
        if not alive:
            raise RuntimeError("every rollout worker died more often than Ray restarts it; see the Ray logs")
        w = min(alive, key=lambda i: self.load[i])
        attempt = self.attempts.get(key, 0)
        self.attempts[key] = attempt + 1
        group_id = f"{key}#{attempt}"
        seed = zlib.crc32(f"{self.seed}/{group_id}".encode()) & 0x7FFFFFFF
        version = self.staleness.c.version
        ref = self.workers[w].run_group.remote(question, group_id, self.group_size, seed)
        task = asyncio.get_running_loop().create_task(self._await_group(key, question, w, ref, version))
        task.ray_ref = ref  # type: ignore[attr-defined]
        self.in_flight[key] = (w, task)
        self.load[w] += 1
        self.ledger.record("admit", key=key, group_id=group_id, version=version, worker=w, **self.counts())

    async def _await_group(self, key: str, question: Any, w: int, ref: Any, version: int) -> None:
        try:
            trajectories = await ref
        except asyncio.CancelledError:
            raise
        except lost_errors() as e:
            self._finish(key, w)
            self.staleness.on_reject()
            self.stats["lost"] += 1
            self.losses[w] += 1
            self.stream.requeue(key)
            self.ledger.record("lost", key=key, error=type(e).__name__, **self.counts())
            return
        except Exception as e:  # the episode code itself failed: count it, do not retry forever
            self._finish(key, w)
            self._failed(key, f"{type(e).__name__}: {str(e)[:300]}", retry=False)
            return
        self._finish(key, w)
        broken = [t for t in trajectories if t.stop_reason in INFRA_STOPS]
        if broken:  # never scored 0 and trained on: the episode failed, not the policy
            errors = (broken[0].meta or {}).get("error", "")
            self._failed(key, f"{len(broken)}/{len(trajectories)} episodes ended in {broken[0].stop_reason}"
                         + (f": {errors}" if errors else ""), retry=True)
            return
        self.failures_in_a_row = 0
        group = Group(key=key, question_id=str(getattr(question, "id", key)), trajectories=trajectories,
                      admitted_version=version)
        self.stats["gen_tokens"] += sum(t.num_generated for t in trajectories)
        if self.filter_groups == "reject" and not group.has_signal:
            self.staleness.on_reject()
            self.stats["rejected"] += 1
            self.ledger.record("reject", key=key, rewards=group.rewards, **self.counts())
            return
        self.staleness.on_accept()
        self.stats["accepted"] += 1
        self.buffer.put(group)
        self.ledger.record("accept", key=key, seq=group.seq, min_version=group.min_version, rewards=group.rewards,
                  **self.counts())

    def _failed(self, key: str, error: str, *, retry: bool) -> None:
        """A group that must not be trained on: re-queue its question while attempts remain (`retry`), else
        skip it; stop the run after `max_consecutive_failures` in a row."""
        self.staleness.on_reject()
        self.stats["failed"] += 1
        self.failures_in_a_row += 1
        attempts = self.attempts.get(key, 0)
        again = retry and attempts < self.max_question_attempts
        if again:
            self.stream.requeue(key)
        self.ledger.record("failed", key=key, error=error, requeued=again, **self.counts())
        if retry and not again:
            self.stats["skipped"] += 1
            self.ledger.record("skip", key=key, attempts=attempts, **self.counts())
        if self.failures_in_a_row >= self.max_consecutive_failures:
            self.fail(RuntimeError(f"{self.failures_in_a_row} rollout groups failed in a row "
                                   f"(train.max_consecutive_failures); the last: {error}"))

    def fail(self, error: BaseException) -> None:
        """Stop the run with `error`: raised by the admission loop, which `next_batch` watches."""
        if self.fatal is None:
            self.fatal = error
            self.ledger.record("fatal", error=str(error)[:500])
            self._wake.set()

    def _finish(self, key: str, w: int) -> None:
        self.in_flight.pop(key, None)
        self.load[w] -= 1
        self._wake.set()

    # -- consumption -------------------------------------------------------------------------
    async def next_batch(self, batch_size: int, version: int, step: int) -> list[Group]:
        """The oldest `batch_size` accepted groups that pass the per-sample staleness bound."""
        batch: list[Group] = []
        while len(batch) < batch_size:
            group = await self._get()
            if not self.staleness.is_fresh(group.min_version, version):
                self.staleness.on_refuse()
                self.stats["refused"] += 1
                self.stream.requeue(group.key)  # never trained on: the question runs again, fresher
                self.ledger.record("refuse", key=group.key, min_version=group.min_version, version=version, **self.counts())
                self._wake.set()
                continue
            batch.append(group)
        for g in batch:
            self.ledger.record("consume", key=g.key, seq=g.seq, step=step, version=version, min_version=g.min_version)
        return batch

    async def _get(self) -> Group:
        """`buffer.get()`, but fail loudly when the admission loop died instead of waiting forever."""
        get = asyncio.ensure_future(self.buffer.get())
        watch = {get} | ({self._task} if self._task is not None else set())
        done, _ = await asyncio.wait(watch, return_when=asyncio.FIRST_COMPLETED)
        if get in done:
            return get.result()
        get.cancel()
        assert self._task is not None
        self._task.result()
        raise RuntimeError("the rollout admission loop stopped")

    def counts(self) -> dict[str, int]:
        """The staleness counters every controller event carries."""
        c = self.staleness.c
        return {"accepted": c.accepted, "running": c.running, "v": c.version, "bound": self.staleness.bound()}
