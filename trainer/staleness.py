"""The staleness rule: how far generation may run ahead of training (AReaL, plus a per-sample bound).

Units: a *group* (one question x G trajectories) is admitted, accepted or rejected as a whole;
B = groups per training step; v = the current weight version (= optimizer steps taken);
eta = max_staleness. A new group is admitted only while both hold after admitting it:

    accepted + running <= (eta + v + 1) * B          staleness bound (AReaL's rule)
    (running + 1) * G  <= max_inflight_trajectories    concurrency cap

`accepted` is cumulative (consumed groups stay counted), so the bound says: group number n (1-based,
in acceptance order) is admitted no earlier than version ceil(n / B) - eta - 1, i.e. it is consumed
by a step whose weights are at most eta versions newer than the ones that began generating it.
Rejected groups (filtered, failed, lost with a crashed worker) leave `running` without entering
`accepted`: their slot is free again at once, so filtering never stalls the pipeline. A group the
trainer refuses as too stale leaves `accepted`, so a replacement can be admitted.

The aggregate bound alone does not cap the staleness of one straggler (a long episode overtaken by
later ones), so the trainer also checks every sample: `is_fresh(min_version, v)` refuses a group
whose oldest token is more than eta versions behind. eta = 0 is synchronous RL with this same code.

Resume (AReaL issue #1388): after a restart v is the checkpoint's version, so `accepted` must be
restored with it (the checkpoint stores it; `rebase` derives it as consumed + buffered when only the
version is known). Resetting it to 0 would open (v + 1) * B slots at once and blow the bound.
In-flight groups die with the process: `running` restarts at 0 and their questions are re-run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class StalenessCounters:
    accepted: int = 0
    running: int = 0
    rejected: int = 0
    refused: int = 0
    version: int = 0


class StalenessController:
    """Admission control for rollout groups (see module docstring for the rule)."""

    def __init__(self, max_staleness: int, batch_size: int, group_size: int = 1,
                 max_inflight_trajectories: int = 1 << 30, version: int = 0):
        if max_staleness < 0 or batch_size < 1 or group_size < 1:
            raise ValueError("need max_staleness >= 0, batch_size >= 1, group_size >= 1")
        if max_inflight_trajectories < group_size:
            raise ValueError(f"max_inflight_trajectories ({max_inflight_trajectories}) is below group_size "
                             f"({group_size}): no group could ever be admitted")
        self.eta, self.batch_size, self.group_size = max_staleness, batch_size, group_size
        self.max_inflight_trajectories = max_inflight_trajectories
        self.c = StalenessCounters(version=version)

    # -- the rule -----------------------------------------------------------------------------
    def bound(self) -> int:
        """(eta + v + 1) * B: the most groups that may be accepted or running at version v."""
        return (self.eta + self.c.version + 1) * self.batch_size

    def capacity(self) -> int:
        """Groups that may be admitted now (never negative)."""
        staleness = self.bound() - (self.c.accepted + self.c.running)
        concurrency = self.max_inflight_trajectories // self.group_size - self.c.running
        return max(0, min(staleness, concurrency))

    def is_fresh(self, min_version: int, version: int | None = None) -> bool:
        """Per-sample bound: the oldest token is at most eta versions behind `version` (default: now)."""
        v = self.c.version if version is None else version
        return min_version < 0 or v - min_version <= self.eta

    # -- events --------------------------------------------------------------------------------
    def try_admit(self) -> bool:
        """Admit one group if the rule allows it."""
        if self.capacity() <= 0:
            return False
        self.c.running += 1
        return True

    def on_accept(self) -> None:
        """A running group finished and entered the buffer."""
        self._finish()
        self.c.accepted += 1

    def on_reject(self) -> None:
        """A running group was filtered, failed or lost: its slot is free again."""
        self._finish()
        self.c.rejected += 1

    def on_refuse(self) -> None:
        """An accepted group was refused by the trainer (too stale): it no longer holds a slot."""
        if self.c.accepted <= 0:
            raise RuntimeError("refused a group but none was accepted")
        self.c.accepted -= 1
        self.c.refused += 1

    def set_version(self, version: int) -> None:
        if version < self.c.version:
            raise ValueError(f"version went backwards: {self.c.version} -> {version}")
        self.c.version = version

    def _finish(self) -> None:
        if self.c.running <= 0:
            raise RuntimeError("a group finished but none was running")
        self.c.running -= 1

    # -- checkpoint / resume -------------------------------------------------------------------
    def state_dict(self) -> dict:
        return asdict(self.c)

    def load_state_dict(self, state: dict) -> None:
        """Restore counters from a checkpoint; in-flight groups died with the old process (running = 0)."""
        self.c = StalenessCounters(**{**state, "running": 0})

    def rebase(self, version: int, consumed: int, buffered: int) -> None:
        """AReaL's `on_version_recovered`, for resumes that know only what was trained on:
        accepted = consumed + buffered groups, at the recovered version."""
        self.c = StalenessCounters(accepted=consumed + buffered, version=version,
                                   rejected=self.c.rejected, refused=self.c.refused)


def inflight_trajectories(t: Any) -> int:
    """Trajectories the run can have in flight at once (`t` a TrainConfig): the concurrency cap in whole groups,
    the staleness bound at version 0 ((eta + 1) B groups), and the rollout workers' slots, whichever is least."""
    groups = min(t.max_inflight_trajectories // t.group_size, (t.max_staleness + 1) * t.batch_size)
    return min(groups * t.group_size, t.rollout_workers * t.worker_concurrency)


def concurrency_warnings(t: Any, engine_max_batch_size: int) -> list[str]:
    """Why the trajectories in flight may be fewer than the config seems to ask (one line each, naming keys):
    the cap below one step's B x G trajectories (steps wait on it), the cap binding below what the engines can
    batch (engine_max_batch_size x engine_replicas) while the staleness bound allows more, and the rollout
    workers' slots below the cap. A cap copied from a recipe that counts groups (ASearcher's
    `max_concurrent_rollouts`) shows up here."""
    cap, step = t.max_inflight_trajectories, t.batch_size * t.group_size
    staleness = (t.max_staleness + 1) * step
    engines = engine_max_batch_size * t.engine_replicas
    out = []
    if cap < step:
        out.append(f"train.max_inflight_trajectories={cap} counts trajectories and admits fewer than one step's "
                   f"batch_size x group_size = {step} ({cap // t.group_size} of {t.batch_size} groups at once)")
    if cap < min(engines, staleness):
        out.append(f"train.max_inflight_trajectories={cap} is below what the engines can batch "
                   f"(engine.max_batch_size x train.engine_replicas = {engines})")
    slots = t.rollout_workers * t.worker_concurrency
    if slots < min(cap, staleness):
        out.append(f"train.rollout_workers x train.worker_concurrency = {slots} caps the trajectories in flight "
                   f"below train.max_inflight_trajectories={cap}")
    return out
