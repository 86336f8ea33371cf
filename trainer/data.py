"""The question stream: a seeded order per epoch, a cursor, and re-runs of lost questions.

Question keys are `<epoch>:<position>`; epoch e visits the questions in the order of
`random.Random(seed + e).shuffle`. A question whose group was lost (crashed worker, process stopped
mid-flight) is put back with `requeue` and handed out again before any new one, so over a whole run,
resumes included, every key is completed exactly once and none is skipped.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any


class QuestionStream:
    """Deterministic, resumable order over a list of questions."""

    def __init__(self, items: list[Any], seed: int = 0, shuffle: bool = True):
        if not items:
            raise ValueError("the training set is empty")
        self.items, self.seed, self.shuffle = items, seed, shuffle
        self.epoch, self.position = 0, 0
        self.retry: deque[str] = deque()
        self._orders: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(len(self.items)))
            if self.shuffle:
                random.Random(self.seed + epoch).shuffle(order)
            self._orders = {epoch: order}
        return self._orders[epoch]

    def item(self, key: str) -> Any:
        epoch, pos = (int(x) for x in key.split(":"))
        return self.items[self._order(epoch)[pos]]

    def next(self) -> tuple[str, Any]:
        """The next question: a re-run first, else the next position (rolling over epochs)."""
        if self.retry:
            key = self.retry.popleft()
            return key, self.item(key)
        if self.position >= len(self.items):
            self.epoch, self.position = self.epoch + 1, 0
        key = f"{self.epoch}:{self.position}"
        self.position += 1
        return key, self.item(key)

    def requeue(self, key: str) -> None:
        """Hand `key` out again (its group was lost before completing)."""
        self.retry.append(key)

    def state_dict(self, in_flight: list[str] = ()) -> dict:
        """Cursor state; `in_flight` keys will be re-run first after a resume."""
        return {"epoch": self.epoch, "position": self.position, "retry": [*in_flight, *self.retry]}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self.retry = deque(state.get("retry", []))
