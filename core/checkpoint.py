"""Durable files (leaf module): append-only JSONL checkpoints, and whole files replaced atomically.

A run that is killed loses at most the unit being written: `read_rows` cuts a torn last line off the
file, and `append_row` writes one line and flushes it. A line is complete only when its newline was
written: a last line without one is torn even when it parses (a kill can land between the closing
brace and the newline), since the next append would otherwise glue two rows into one bad line. A
complete line that is not a JSON object is an error naming the file and line. Evaluation (results.jsonl) and QA synthesis (items.jsonl) resume from these.

`write_atomic` writes a whole file through a temporary one, fsyncs it and renames it into place, so a
reader (or a crash) sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a checkpoint file ([] when it does not exist); a torn last line is cut off the file."""
    if not path.exists():
        return []
    rows, good_bytes = [], 0
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            if not raw.endswith(b"\n"):  # only the last line can lack it: torn, parsed or not
                log.warning("%s: dropping a torn last line %d (%d bytes, no newline)", path, line_no, len(raw))
                break
            try:
                row = json.loads(raw)
            except ValueError:
                raise ValueError(f"{path}:{line_no}: not JSON: {raw[:80]!r}") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{line_no}: a JSON {type(row).__name__}, not an object (one row per line)")
            rows.append(row)
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


def write_atomic(path: str | os.PathLike, parts: str | Iterable[str]) -> None:
    """Replace `path` with `parts` (a string, or strings written in turn so a large file is never held
    whole): temporary file, fsync, rename."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8", newline="\n") as f:
        for part in [parts] if isinstance(parts, str) else parts:
            f.write(part)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
