"""On-disk document and page stores (SQLite), so a 21M-passage corpus never lives in Python objects.

- `DocStore`: FAISS row id -> the corpus row exactly as given (JSON text), for `/retrieve`.
- `PageStore`: URL -> page row (`{"url", "contents", ...}` from pages.jsonl), for `/access` and
  the access tool's local world. Lookups try the exact URL, then a normalised key (scheme,
  `www.`, fragment, trailing slash, percent-encoding and `index.php/` vs `index.php?title=`
  differences removed), so the URLs agents actually write still hit.

Readers open the database read-only with one connection per thread (sqlite3 connections are
not shareable across threads), so the retrieval worker thread and HTTP handlers never contend.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit


class CorpusError(ValueError):
    """A bad line in a corpus/pages file; the message starts with `file:line:`."""


def page_key(url: str) -> str:
    """Normalised lookup key of a URL: host (no www.) + decoded path (+ query), no scheme/fragment."""
    url = url.strip()
    if "://" not in url:
        url = "https://" + url
    parts = urlsplit(url)
    host = (parts.hostname or "").lower().rstrip(".")
    host = host[4:] if host.startswith("www.") else host
    path = unquote(parts.path).replace(" ", "_").rstrip("/")
    query = unquote(parts.query).replace(" ", "_")
    if path.endswith("/index.php") and query.startswith("title="):
        path, query = f"{path}/{query[len('title='):]}", ""
    return f"{host}{path}" + (f"?{query}" if query else "")


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line; raises CorpusError naming file and line."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise CorpusError(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno})") from e
            if not isinstance(row, dict):
                raise CorpusError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row


class _Reader:
    """Thread-local read-only SQLite connections to one file."""

    def __init__(self, path: Path):
        if not path.exists():
            raise FileNotFoundError(f"store not found: {path}")
        self.path = path
        self._local = threading.local()

    def db(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
            self._local.conn = conn
        return conn


class DocStore(_Reader):
    """Row id (0-based, = FAISS id) -> corpus row."""

    def __len__(self) -> int:
        return self.db().execute("SELECT COUNT(*) FROM docs").fetchone()[0]

    def get_many(self, ids: Iterable[int]) -> dict[int, dict[str, Any]]:
        wanted = sorted({int(i) for i in ids if int(i) >= 0})
        out: dict[int, dict[str, Any]] = {}
        for start in range(0, len(wanted), 900):  # SQLite's default variable limit is 999
            chunk = wanted[start:start + 900]
            marks = ",".join("?" * len(chunk))
            for rowid, doc in self.db().execute(f"SELECT rowid, doc FROM docs WHERE rowid IN ({marks})", chunk):
                out[rowid] = json.loads(doc)
        return out

    def get(self, rowid: int) -> dict[str, Any] | None:
        return self.get_many([rowid]).get(rowid)

    def iter_texts(self, batch: int = 1024) -> Iterator[list[tuple[int, str]]]:
        """(rowid, text to encode) in row order, `batch` at a time."""
        last = -1
        while True:
            rows = self.db().execute("SELECT rowid, text FROM docs WHERE rowid > ? ORDER BY rowid LIMIT ?",
                                     (last, batch)).fetchall()
            if not rows:
                return
            yield rows
            last = rows[-1][0]


class DocStoreWriter:
    """Appends corpus rows to a new docs SQLite file (used only by the index builder)."""

    def __init__(self, path: Path):
        self.db = sqlite3.connect(path)
        self.db.execute("PRAGMA journal_mode=OFF")
        self.db.execute("PRAGMA synchronous=OFF")
        self.db.execute("CREATE TABLE docs (rowid INTEGER PRIMARY KEY, id TEXT, url TEXT, text TEXT NOT NULL, "
                        "doc TEXT NOT NULL)")
        self.count = 0
        self._pending: list[tuple] = []

    def add(self, doc: dict[str, Any], text: str) -> int:
        rowid = self.count
        self._pending.append((rowid, str(doc.get("id", rowid)), doc.get("url"), text,
                              json.dumps(doc, ensure_ascii=False)))
        self.count += 1
        if len(self._pending) >= 10_000:
            self.flush()
        return rowid

    def flush(self) -> None:
        self.db.executemany("INSERT INTO docs VALUES (?, ?, ?, ?, ?)", self._pending)
        self.db.commit()
        self._pending.clear()

    def close(self) -> None:
        self.flush()
        self.db.execute("CREATE INDEX docs_url ON docs(url)")
        self.db.commit()
        self.db.close()


class PageStore(_Reader):
    """URL -> page row; build one with `PageStore.build(pages.jsonl, out.sqlite)`."""

    def __len__(self) -> int:
        return self.db().execute("SELECT COUNT(*) FROM pages").fetchone()[0]

    def get(self, url: str) -> dict[str, Any] | None:
        db = self.db()
        row = db.execute("SELECT doc FROM pages WHERE url = ?", (url.strip(),)).fetchone()
        if row is None:
            row = db.execute("SELECT doc FROM pages WHERE key = ? LIMIT 1", (page_key(url),)).fetchone()
        return json.loads(row[0]) if row else None

    def __contains__(self, url: str) -> bool:
        return self.get(url) is not None

    @classmethod
    def build(cls, jsonl: Path, out: Path) -> PageStore:
        """Write `out` from pages.jsonl (`{"url", "contents", ...}` per line), atomically."""
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}-{threading.get_ident()}")
        tmp.unlink(missing_ok=True)
        db = sqlite3.connect(tmp)
        try:
            db.execute("PRAGMA journal_mode=OFF")
            db.execute("CREATE TABLE pages (url TEXT PRIMARY KEY, key TEXT NOT NULL, doc TEXT NOT NULL)")
            batch: list[tuple[str, str, str]] = []
            for lineno, row in iter_jsonl(jsonl):
                url, contents = row.get("url"), row.get("contents", row.get("text"))
                if not isinstance(url, str) or not url.strip():
                    raise CorpusError(f"{jsonl}:{lineno}: page has no 'url' string")
                if not isinstance(contents, str):
                    raise CorpusError(f"{jsonl}:{lineno}: page has no 'contents' string")
                batch.append((url.strip(), page_key(url), json.dumps(row, ensure_ascii=False)))
                if len(batch) >= 5000:
                    db.executemany("INSERT OR REPLACE INTO pages VALUES (?, ?, ?)", batch)
                    batch.clear()
            db.executemany("INSERT OR REPLACE INTO pages VALUES (?, ?, ?)", batch)
            db.execute("CREATE INDEX pages_key ON pages(key)")
            db.commit()
            db.close()
            os.replace(tmp, out)
        except BaseException:
            db.close()
            tmp.unlink(missing_ok=True)
            raise
        return cls(out)
