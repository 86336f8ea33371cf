"""Accepted rollout groups waiting for the trainer, consumed oldest first.

A `Group` is one question's G trajectories plus the bookkeeping the trainer needs: its data-stream
key (so a resume neither repeats nor skips it), the version at admission, and its acceptance order.
The buffer is part of every checkpoint: on resume the accepted-but-unconsumed groups come back.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from dataclasses import dataclass, field

from agent.trajectory import Trajectory
from trainer.advantages import has_signal


@dataclass
class Group:
    """G trajectories sampled for one question."""

    key: str
    """Data-stream key `<epoch>:<position>` of the question."""
    question_id: str
    trajectories: list[Trajectory] = field(default_factory=list)
    admitted_version: int = 0
    """Weight version when the group was admitted."""
    seq: int = -1
    """Acceptance order (set by the buffer)."""

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]

    @property
    def min_version(self) -> int:
        """Oldest version of any policy token of the group (-1 when nothing was generated)."""
        vs = [t.min_version for t in self.trajectories if t.min_version >= 0]
        return min(vs) if vs else -1

    @property
    def has_signal(self) -> bool:
        return has_signal(self.rewards)

    def to_json(self) -> str:
        return json.dumps({"key": self.key, "question_id": self.question_id, "admitted_version": self.admitted_version,
                           "seq": self.seq, "trajectories": [json.loads(t.to_json()) for t in self.trajectories]})

    @classmethod
    def from_json(cls, line: str) -> Group:
        d = json.loads(line)
        d["trajectories"] = [Trajectory.from_json(t) for t in d["trajectories"]]
        return cls(**d)


class GroupBuffer:
    """FIFO of accepted groups with an awaitable `get` (the driver runs one asyncio loop)."""

    def __init__(self) -> None:
        self._groups: deque[Group] = deque()
        self._changed = asyncio.Event()
        self._seq = 0

    def __len__(self) -> int:
        return len(self._groups)

    def put(self, group: Group) -> None:
        if group.seq < 0:
            group.seq = self._seq
        self._seq = max(self._seq, group.seq + 1)
        self._groups.append(group)
        self._changed.set()

    async def get(self) -> Group:
        """The oldest accepted group, waiting until one exists."""
        while not self._groups:
            self._changed.clear()
            await self._changed.wait()
        return self._groups.popleft()

    def snapshot(self) -> list[Group]:
        return list(self._groups)

    def restore(self, groups: list[Group]) -> None:
        for g in sorted(groups, key=lambda g: g.seq):
            self.put(g)
