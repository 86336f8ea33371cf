"""Append-only JSONL checkpoints: one row per finished unit of work, written last (leaf module).

A run that is killed loses at most the unit being written: `read_rows` cuts a torn last line off the
file (a complete line that is not JSON is an error naming it), and `append_row` writes one line and
flushes it. Evaluation (results.jsonl) and QA synthesis (items.jsonl) resume from these.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a checkpoint file ([] when it does not exist); a torn last line is cut off the file."""
    if not path.exists():
        return []
    rows, good_bytes = [], 0
    with path.open("rb") as f:
        for raw in f:
            try:
                rows.append(json.loads(raw))
            except ValueError:
                if raw.endswith(b"\n"):
                    raise ValueError(f"{path}: line {len(rows) + 1} is not JSON") from None
                log.warning("%s: dropping a torn last line (%d bytes)", path, len(raw))
                break
            good_bytes += len(raw)
    if good_bytes < path.stat().st_size:
        with path.open("r+b") as f:
            f.truncate(good_bytes)
    return rows


def append_row(path: Path, row: dict[str, Any], *, sync: bool = False) -> None:
    """Append one JSON line and flush it (`sync`: also fsync, for rows that cost minutes to make)."""
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        f.flush()
        if sync:
            os.fsync(f.fileno())
