"""Persistent tool-result cache: SQLite, keyed by tool namespace + normalised arguments, with a TTL.

Search and page results are expensive (money for Serper, seconds for a page) and repeat a lot
across rollouts of the same question, so every tool consults this cache first. One SQLite file
serves many processes (Ray rollout workers): WAL journal mode lets readers and one writer work
at once, and a busy timeout absorbs short write contention. Only successful results are stored.

Key = sha256(namespace + "\\0" + canonical JSON of the normalised arguments), where normalising
strips and collapses whitespace in strings and sorts mapping keys, so `{"query": " a  b"}` and
`{"query": "a b"}` share an entry.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any


def normalise_args(value: Any) -> Any:
    """Canonical form of tool arguments: whitespace-collapsed strings, sorted keys, lists kept in order."""
    if isinstance(value, str):
        return " ".join(value.split())
    if isinstance(value, dict):
        return {str(k): normalise_args(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [normalise_args(v) for v in value]
    return value


def cache_key(namespace: str, args: dict[str, Any]) -> str:
    canonical = json.dumps(normalise_args(args), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{namespace}\0{canonical}".encode()).hexdigest()


class ToolCache:
    """SQLite cache of JSON values with a TTL and hit/miss counters (thread-safe).

    `path=None` keeps the cache in memory (per process), e.g. for tests or `--no-cache` runs.
    """

    def __init__(self, path: str | Path | None, ttl_s: float = 7 * 24 * 3600.0):
        self.path = str(path) if path else ":memory:"
        self.ttl_s = ttl_s
        self.hits = 0
        self.misses = 0
        self.expired = 0
        self.puts = 0
        self._lock = threading.Lock()
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=10.0, isolation_level=None)
        if path:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS cache (key TEXT PRIMARY KEY, namespace TEXT NOT NULL, "
                         "created REAL NOT NULL, value TEXT NOT NULL)")

    def get(self, namespace: str, args: dict[str, Any]) -> Any | None:
        """The cached value, or None on a miss or when the entry is older than the TTL."""
        key = cache_key(namespace, args)
        with self._lock:
            row = self._db.execute("SELECT created, value FROM cache WHERE key = ?", (key,)).fetchone()
            if row is None:
                self.misses += 1
                return None
            if self.ttl_s > 0 and time.time() - row[0] > self.ttl_s:
                self._db.execute("DELETE FROM cache WHERE key = ?", (key,))
                self.misses += 1
                self.expired += 1
                return None
            self.hits += 1
        return json.loads(row[1])

    def put(self, namespace: str, args: dict[str, Any], value: Any) -> None:
        """Store a JSON-serialisable value (replacing any older entry)."""
        blob = json.dumps(value, ensure_ascii=False)
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO cache (key, namespace, created, value) VALUES (?, ?, ?, ?)",
                             (cache_key(namespace, args), namespace, time.time(), blob))
            self.puts += 1

    def purge_expired(self) -> int:
        """Delete entries older than the TTL; returns how many."""
        with self._lock:
            cur = self._db.execute("DELETE FROM cache WHERE created < ?", (time.time() - self.ttl_s,))
            return cur.rowcount

    def clear(self, namespace: str | None = None) -> None:
        with self._lock:
            if namespace is None:
                self._db.execute("DELETE FROM cache")
            else:
                self._db.execute("DELETE FROM cache WHERE namespace = ?", (namespace,))

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM cache").fetchone()[0]

    def stats(self) -> dict[str, float]:
        total = self.hits + self.misses
        return {"hits": self.hits, "misses": self.misses, "expired": self.expired, "puts": self.puts,
                "hit_rate": self.hits / total if total else 0.0}

    def close(self) -> None:
        with self._lock:
            self._db.close()
