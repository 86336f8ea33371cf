"""The rollout ledger: `<run>/rollouts.jsonl`, one JSON object per event in the life of a group.

    ledger = RolloutLedger(run.path / "rollouts.jsonl")
    ledger.record("accept", key=..., min_version=..., rewards=[...])
    events = ledger.read()

Events: `admit`, `accept`, `reject` (no reward variance), `refuse` (too stale when consumed), `consume`,
`failed` (an episode failed: requeued or not), `skip` (out of attempts), `lost` (the worker died), `fatal`
(from the rollout controller); `resume` and `learner_lost` (the training loop); `engine_*` (the engine
supervisor and the managed servers' watch). Every row carries `event` and `t` (Unix seconds). Tests,
`benchmarks/fault_tolerance.py` and post-mortems read it; a crash can leave a torn last line, which
`read` leaves out (and never cuts off the file: a run may be writing it). One writer (the driver's event loop) appends: no locking.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


class RolloutLedger:
    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path else None
        """None: events are dropped (controllers built by tests that do not read them)."""

    def record(self, event: str, **fields: Any) -> None:
        """Append one event (a line of JSON) to the ledger."""
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps({"event": event, "t": round(time.time(), 3), **fields}) + "\n")

    def read(self) -> list[dict[str, Any]]:
        """Every event so far, oldest first ([] before the first)."""
        if self.path is None or not self.path.exists():
            return []
        lines = self.path.read_bytes().split(b"\n")
        return [json.loads(line) for line in lines[:-1]]  # the part after the last newline: empty, or torn
