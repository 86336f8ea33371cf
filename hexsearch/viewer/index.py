"""A line index over a trajectory JSONL file: byte offsets and a small summary of every line.

A trajectory line is mostly its segments (token ids, masks, log-probs, versions); everything a list
page shows comes before or after them. The summary of a line is parsed from the line with the
`"segments": [...]` value cut out (segments hold numbers only, so the first `"tool_calls":` after
`"segments":` is the real key), which makes indexing ~10x faster than parsing whole lines. Whole
lines are read (by offset) only when one trajectory is opened.

The index grows with the file: `refresh()` parses only complete lines appended since the last call,
so a run that is still writing shows its new trajectories, and a torn last line waits for its end.
A file that shrank (a resumed run rewrote it) is indexed again from the start. A line that is not
a trajectory is kept as an error row naming the file and line; it never stops the rest.

A large file (over BACKGROUND_BYTES still to read) is indexed in a background thread, so the first
page of a 100,000-trajectory run shows at once while the rest is read; a finished index of at least
CACHE_MIN_ROWS lines is kept under ~/.cache/hexsearch/viewer-index/ (never in the run folder) and
reused the next time the same file is opened, reading only what was appended since.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.checkpoint import write_atomic

SEG_KEY, TOOLS_KEY = b'"segments":', b'"tool_calls":'
CHUNK = 8 << 20
TEXT_CHARS = 160
CACHE_VERSION = 1
BACKGROUND_BYTES = 16 << 20
CACHE_MIN_ROWS = 5000
"""Indexes of fewer lines are rebuilt each time (faster than reading a cache)."""


def summarise(line: bytes) -> dict[str, Any]:
    """The list-page fields of one trajectory line (ValueError when it is not a trajectory)."""
    start = line.find(SEG_KEY)
    end = line.find(TOOLS_KEY, start) if start >= 0 else -1
    d = json.loads(line[:start] + line[end:] if 0 <= start < end else line)
    if not isinstance(d, dict) or "question" not in d:
        raise ValueError("not a trajectory (no `question`)")
    meta = d.get("meta") if isinstance(d.get("meta"), dict) else {}
    info = d.get("reward_info") if isinstance(d.get("reward_info"), dict) else {}
    pred = d.get("prediction")
    return {"qid": str(d.get("question_id", "")), "q": str(d["question"])[:TEXT_CHARS],
            "group": str(d.get("group_id", "")), "reward": _num(d.get("reward")),
            "stop": str(d.get("stop_reason", "")), "turns": d.get("num_turns", 0),
            "tools": len(d.get("tool_calls") or []), "pred": None if pred is None else str(pred)[:TEXT_CHARS],
            "step": meta.get("step"), "key": meta.get("key"), "gen": meta.get("generated_tokens"),
            "errors": sum(1 for t in d.get("tool_calls") or [] if isinstance(t, dict) and t.get("error")),
            "fmt": d.get("format_errors", 0), "correct": info.get("score", d.get("reward")) == 1.0}


def _summary_or_error(raw: bytes) -> dict[str, Any]:
    try:
        return summarise(raw)
    except (ValueError, TypeError) as e:
        return {"bad": _short_error(e)}


def cache_root() -> Path:
    """Where finished indexes are kept (never inside a run folder: run folders are only read)."""
    from serving.models import cache_dir

    return cache_dir() / "viewer-index"


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


@dataclass
class TrajectoryIndex:
    """Offsets and summaries of one JSONL file; thread-safe, grows with the file."""

    path: Path
    rows: list[dict[str, Any]] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    groups: dict[str, list[int]] = field(default_factory=dict)
    keys: dict[str, int] = field(default_factory=dict)
    errors: list[dict[str, Any]] = field(default_factory=list)
    scanned: int = 0
    inode: int = -1
    size: int = 0
    building: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def refresh(self) -> TrajectoryIndex:
        """Index the complete lines appended since the last call (everything, the first time): here and
        now when that is under BACKGROUND_BYTES, else in a background thread (rows appear as they are
        parsed, `building` says so)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        with self.lock:
            if self.building:
                return self
            if st is None or st.st_ino != self.inode or st.st_size < self.scanned:
                self._reset(st.st_ino if st else -1)
                if st is not None and not self.rows:
                    self._load_cache(st.st_ino, st.st_size)
            if st is None or st.st_size == self.scanned:
                return self
            self.building, self.size = True, st.st_size
            background = st.st_size - self.scanned > BACKGROUND_BYTES
        if not background:
            self._scan()
        elif self._scan_chunk():  # the first chunk here (the first page shows at once), the rest in a thread
            threading.Thread(target=self._scan, name=f"index-{self.path.name}", daemon=True).start()
        return self

    def _scan_chunk(self) -> bool:
        """Index one CHUNK now; True when there is more to read."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.scanned)
                block = f.read(CHUNK)
            self._parse(block[: block.rfind(b"\n") + 1], self.scanned)
            return True
        except BaseException:
            with self.lock:
                self.building = False
            raise

    def _scan(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.scanned)
                pos, tail, added = self.scanned, b"", 0
                while block := f.read(CHUNK):
                    lines = (tail + block).split(b"\n")
                    tail = lines.pop()
                    added += self._parse(b"\n".join(lines) + b"\n" if lines else b"", pos)
                    pos = self.scanned
            if added >= CACHE_MIN_ROWS:
                self._save_cache()
        finally:
            with self.lock:
                self.building = False

    def _parse(self, data: bytes, pos: int) -> int:
        """Index the complete lines of `data`, which starts at byte `pos`; returns the number of lines."""
        parsed = []
        for raw in data.split(b"\n")[:-1]:
            if raw.strip():
                parsed.append((pos, _summary_or_error(raw)))
            pos += len(raw) + 1
        with self.lock:
            for start, row in parsed:
                self._add(row, start)
            self.scanned = pos  # a torn last line (no newline yet) is read again next time
        return len(parsed)

    # -- the cache: a finished index, reloaded when the same file is opened again ----------------
    def _cache_file(self) -> Path:
        digest = hashlib.sha256(str(self.path.resolve()).encode()).hexdigest()[:24]
        return cache_root() / f"{digest}.json"

    def _save_cache(self) -> None:
        with self.lock:
            blob = json.dumps({"version": CACHE_VERSION, "path": str(self.path.resolve()), "inode": self.inode,
                               "scanned": self.scanned, "tail": self._tail(self.scanned), "rows": self.rows,
                               "offsets": self.offsets},
                              separators=(",", ":"))
        try:
            self._cache_file().parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self._cache_file(), blob)
        except OSError:
            pass  # a read-only home: the index is rebuilt next time, nothing else changes

    def _load_cache(self, inode: int, size: int) -> None:
        try:
            d = json.loads(self._cache_file().read_text())
        except (OSError, ValueError):
            return
        if (d.get("version") != CACHE_VERSION or d.get("inode") != inode or d.get("scanned", 0) > size
                or d.get("path") != str(self.path.resolve()) or len(d["rows"]) != len(d["offsets"])
                or d.get("tail") != self._tail(d["scanned"])):  # the same bytes still end the indexed part
            return
        for row, start in zip(d["rows"], d["offsets"], strict=True):
            self._add(row, start)
        self.scanned = d["scanned"]

    def _tail(self, end: int) -> str:
        """A fingerprint of the 4 KB before byte `end` (a file rewritten in place no longer matches its cache)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(max(0, end - 4096))
                return hashlib.sha256(f.read(min(end, 4096))).hexdigest()
        except OSError:
            return ""

    def _reset(self, inode: int) -> None:
        self.rows, self.offsets, self.groups, self.keys, self.errors = [], [], {}, {}, []
        self.scanned, self.inode = 0, inode

    def _add(self, row: dict[str, Any], pos: int) -> None:
        n = len(self.rows)
        if "bad" in row:
            self.errors.append({"file": str(self.path), "line": n + 1, "error": row["bad"]})
        row["n"] = n
        row["line"] = n + 1
        self.rows.append(row)
        self.offsets.append(pos)
        if row.get("group"):
            self.groups.setdefault(row["group"], []).append(n)
        if row.get("key"):
            self.keys[str(row["key"])] = n

    def wait(self, timeout: float = 30.0) -> TrajectoryIndex:
        """Until a background build has finished (or `timeout` seconds)."""
        deadline = time.monotonic() + timeout
        while self.building and time.monotonic() < deadline:
            time.sleep(0.02)
        return self

    def read(self, n: int) -> dict[str, Any]:
        """The whole trajectory `n` (0-based row), parsed; ValueError naming file and line when it is bad."""
        with self.lock:
            if not 0 <= n < len(self.offsets):
                raise IndexError(f"{self.path.name}: no trajectory {n} (the file has {len(self.offsets)})")
            start = self.offsets[n]
        with open(self.path, "rb") as f:
            f.seek(start)
            raw = f.readline()
        try:
            d = json.loads(raw)
            if not isinstance(d, dict):
                raise ValueError("not a JSON object")
            return d
        except ValueError as e:
            raise ValueError(f"{self.path}:{n + 1}: {_short_error(e)}") from None

    def page(self, *, offset: int = 0, limit: int = 50, stop: str = "", text: str = "", group: str = "",
             correct: str = "", min_reward: float | None = None, max_reward: float | None = None,
             bad: bool = False) -> dict[str, Any]:
        """One page of summaries matching the filters, the number that match, and the stop reasons seen."""
        text = text.lower()
        with self.lock:
            rows = self.rows if not group else [self.rows[i] for i in self.groups.get(group, [])]
            stops: dict[str, int] = {}
            hits: list[dict[str, Any]] = []
            for r in rows:
                if "bad" in r:
                    if bad or not (stop or text or group or correct or min_reward is not None
                                   or max_reward is not None):
                        hits.append(r)
                    continue
                stops[r["stop"]] = stops.get(r["stop"], 0) + 1
                if bad or (stop and r["stop"] != stop) or (text and text not in r["q"].lower()
                                                           and text not in r["qid"].lower()):
                    continue
                if (correct == "yes" and not r["correct"]) or (correct == "no" and r["correct"]):
                    continue
                rw = r["reward"] if r["reward"] is not None else 0.0
                if (min_reward is not None and rw < min_reward) or (max_reward is not None and rw > max_reward):
                    continue
                hits.append(r)
            return {"total": len(self.rows), "indexing": self.building,
                    "indexed_bytes": self.scanned, "size": max(self.size, self.scanned), "matched": len(hits), "offset": offset,
                    "rows": hits[offset:offset + max(1, min(limit, 500))], "stops": stops,
                    "errors": self.errors[:20], "error_count": len(self.errors)}


def _short_error(e: Exception) -> str:
    text = str(e)
    return text if len(text) <= 200 else text[:199] + "…"
