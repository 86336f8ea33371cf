"""The staleness rule under random interleavings (property tests), the per-sample bound, and resume."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.staleness import StalenessController

EVENTS = st.lists(st.tuples(st.sampled_from(["admit", "admit", "finish", "finish", "train"]),
                            st.integers(0, 1000), st.sampled_from(["accept", "accept", "reject", "lost"])),
                  max_size=300)


class Sim:
    """A trainer + rollout pool driven by random events, using only the controller's public API."""

    def __init__(self, eta: int, batch: int, group: int = 2, max_conc: int = 16):
        self.sc = StalenessController(eta, batch, group, max_conc)
        self.eta, self.batch = eta, batch
        self.running: list[int] = []          # admission versions of running groups
        self.buffer: deque[int] = deque()     # min versions of accepted groups, acceptance order
        self.consumed: list[tuple[int, int]] = []   # (group min version, learner version at consumption)
        self.version = 0

    def check(self) -> None:
        c = self.sc.c
        assert c.accepted + c.running <= self.sc.bound()
        assert c.running * self.sc.group_size <= self.sc.max_inflight_trajectories
        assert c.running == len(self.running) and c.accepted >= 0

    def admit(self) -> bool:
        ok = self.sc.try_admit()
        if ok:
            self.running.append(self.version)
        self.check()
        return ok

    def finish(self, i: int, outcome: str) -> None:
        if not self.running:
            return
        v = self.running.pop(i % len(self.running))
        if outcome == "accept":
            self.sc.on_accept()
            self.buffer.append(v)
        else:
            self.sc.on_reject()
        self.check()

    def step(self, kind: str, i: int, outcome: str) -> None:
        if kind == "admit":
            self.admit()
        elif kind == "finish":
            self.finish(i, outcome)
        else:
            self.train()

    def train(self) -> bool:
        """One step if B fresh groups are buffered (refusing stale ones), then a version bump."""
        batch = []
        while self.buffer and len(batch) < self.batch:
            v = self.buffer.popleft()
            if self.sc.is_fresh(v, self.version):
                batch.append(v)
            else:
                self.sc.on_refuse()
        if len(batch) < self.batch:
            for v in reversed(batch):
                self.buffer.appendleft(v)
            return False
        self.consumed += [(v, self.version) for v in batch]
        self.version += 1
        self.sc.set_version(self.version)
        self.check()
        return True


@settings(max_examples=150, deadline=None)
@given(eta=st.integers(0, 4), batch=st.integers(1, 4), events=EVENTS)
def test_rule_holds_under_random_interleavings(eta, batch, events):
    sim = Sim(eta, batch)
    for kind, i, outcome in events:
        sim.step(kind, i, outcome)
    # no consumed sample is older than the bound
    assert all(v_now - v <= eta for v, v_now in sim.consumed)


@settings(max_examples=100, deadline=None)
@given(eta=st.integers(0, 3), batch=st.integers(1, 4), events=EVENTS)
def test_pipeline_never_stalls(eta, batch, events):
    """Whenever nothing runs and the trainer lacks a batch, a new group can be admitted."""
    sim = Sim(eta, batch)
    for kind, i, outcome in events:
        sim.step(kind, i, outcome)
        if not sim.running and len(sim.buffer) < batch:
            assert sim.sc.capacity() > 0


@settings(max_examples=100, deadline=None)
@given(batch=st.integers(1, 4), events=EVENTS)
def test_zero_staleness_is_synchronous(batch, events):
    """eta = 0: every consumed group was generated entirely by the weights it is trained from."""
    sim = Sim(0, batch)
    for kind, i, outcome in events:
        sim.step(kind, i, outcome)
    assert all(v == v_now for v, v_now in sim.consumed)
    assert sim.sc.c.refused == 0


def test_bound_formula_and_rejections_free_slots():
    sc = StalenessController(max_staleness=1, batch_size=2, group_size=4, max_inflight_trajectories=100)
    assert sc.bound() == 4
    assert [sc.try_admit() for _ in range(5)] == [True, True, True, True, False]
    sc.on_reject()                                  # a filtered group frees its slot at once
    assert sc.try_admit() and not sc.try_admit()
    for _ in range(4):
        sc.on_accept()
    assert sc.capacity() == 0
    sc.set_version(1)                               # one step later: B more slots
    assert sc.capacity() == 2
    sc.on_refuse()                                  # a refused (too stale) group frees its slot too
    assert sc.capacity() == 3


def test_concurrency_cap_counts_episodes():
    sc = StalenessController(max_staleness=10, batch_size=8, group_size=4, max_inflight_trajectories=10)
    assert [sc.try_admit() for _ in range(3)] == [True, True, False]   # 2 groups x 4 episodes <= 10
    with pytest.raises(ValueError, match="group_size"):
        StalenessController(1, 1, group_size=8, max_inflight_trajectories=4)


def test_per_sample_bound():
    sc = StalenessController(max_staleness=2, batch_size=1, version=5)
    assert sc.is_fresh(3) and not sc.is_fresh(2) and sc.is_fresh(-1)
    assert sc.is_fresh(2, version=4)


def test_resume_restores_accepted_with_version():
    """AReaL #1388: after a restart at version v the bound must not reopen (v + 1) * B slots."""
    sc = StalenessController(max_staleness=1, batch_size=4)
    for v in range(3):
        while sc.try_admit():
            pass
        for _ in range(sc.c.running):
            sc.on_accept()
        sc.set_version(v + 1)
    sc.try_admit()                                  # one group in flight when the process dies
    before = sc.capacity()
    state = sc.state_dict()

    resumed = StalenessController(max_staleness=1, batch_size=4)
    resumed.load_state_dict(state)
    assert resumed.c.version == 3 and resumed.c.accepted == sc.c.accepted and resumed.c.running == 0
    assert resumed.capacity() == before + 1         # only the lost in-flight group's slot comes back

    naive = StalenessController(max_staleness=1, batch_size=4, version=3)   # the #1388 bug
    assert naive.capacity() > resumed.capacity()

    rebased = StalenessController(max_staleness=1, batch_size=4)
    rebased.rebase(version=3, consumed=12, buffered=sc.c.accepted - 12)
    assert rebased.capacity() == resumed.capacity()
