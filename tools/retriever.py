"""Retriever: load an index folder and answer batches of queries with scored documents.

    r = Retriever("idx/")
    hits = r.search(["who built the veyra lighthouse"], topk=5)   # [[Hit(rowid, score, doc), ...]]

One call = encode the batch once (texts already seen come from an LRU query-embedding cache),
one FAISS search for the whole batch, one document-store read for all hit ids. Scores are
inner products of unit vectors (cosine similarity). The object is thread-safe; the retrieval
service calls it from a single worker thread so the encoder never competes with itself.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tools.docstore import DocStore, PageStore
from tools.index import read_meta


@dataclass
class Hit:
    rowid: int
    score: float
    doc: dict[str, Any]


class QueryCache:
    """LRU map query text -> embedding, with hit/miss counters."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._data: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> np.ndarray | None:
        with self._lock:
            vec = self._data.get(key)
            if vec is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return vec

    def put(self, key: str, vec: np.ndarray) -> None:
        if self.capacity <= 0:
            return
        with self._lock:
            self._data[key] = vec
            self._data.move_to_end(key)
            while len(self._data) > self.capacity:
                self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)


class Retriever:
    """Dense retriever over an index folder built by `tools.index.build_index`."""

    def __init__(self, index_dir: str | Path, *, threads: int = 0, query_cache_size: int = 10_000,
                 nprobe: int | None = None, ef_search: int | None = None, mmap: bool = False,
                 batch_size: int = 64, encoder: Any = None, encoder_dtype: str = "float32"):
        """`encoder`: an already-loaded Encoder to share; its settings must match the index's.
        `encoder_dtype`: float32, bfloat16 or auto (tools/encoder.py says what bf16 costs and gains)."""
        import faiss

        from tools.encoder import Encoder

        self.index_dir = Path(index_dir)
        self.meta = read_meta(self.index_dir)
        if threads > 0:
            faiss.omp_set_num_threads(threads)
        flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap else 0
        self.index = faiss.read_index(str(self.index_dir / "index.faiss"), flags)
        params = self.meta.get("params", {})
        if hasattr(self.index, "nprobe"):
            self.index.nprobe = nprobe or params.get("nprobe", 16)
        if hasattr(self.index, "hnsw"):
            self.index.hnsw.efSearch = ef_search or params.get("ef_search", 128)
        if encoder is None:
            encoder = Encoder(threads=threads, batch_size=batch_size, dtype=encoder_dtype, **self.meta["encoder"])
        elif encoder.describe() != self.meta["encoder"]:
            raise ValueError(f"encoder {encoder.describe()} does not match the index's {self.meta['encoder']}")
        self.encoder = encoder
        self.docs = DocStore(self.index_dir / "docs.sqlite")
        pages = self.index_dir / "pages.sqlite"
        self.pages = PageStore(pages) if pages.exists() else None
        self.query_cache = QueryCache(query_cache_size)
        self.timings = {"encode_s": 0.0, "search_s": 0.0, "fetch_s": 0.0}
        self.queries = 0

    @property
    def size(self) -> int:
        return int(self.index.ntotal)

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        """Unit-norm query embeddings [n, dim]; cached texts skip the encoder."""
        out = np.empty((len(queries), self.encoder.dim), dtype=np.float32)
        todo: dict[str, list[int]] = {}
        for i, q in enumerate(queries):
            vec = self.query_cache.get(q)
            if vec is None:
                todo.setdefault(q, []).append(i)
            else:
                out[i] = vec
        if todo:
            t0 = time.perf_counter()
            texts = list(todo)
            vecs = self.encoder.encode(texts, kind="query")
            self.timings["encode_s"] += time.perf_counter() - t0
            for text, vec in zip(texts, vecs, strict=True):
                self.query_cache.put(text, vec)
                out[todo[text]] = vec
        return out

    def search_ids(self, queries: list[str], topk: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, ids), each [n, topk]; ids are -1 where the index has fewer than topk documents."""
        self.queries += len(queries)
        emb = self.encode_queries(queries)
        t0 = time.perf_counter()
        scores, ids = self.index.search(emb, max(1, topk))
        self.timings["search_s"] += time.perf_counter() - t0
        return scores, ids

    def fetch(self, ids: np.ndarray) -> dict[int, dict[str, Any]]:
        t0 = time.perf_counter()
        docs = self.docs.get_many(int(i) for i in np.asarray(ids).ravel() if i >= 0)
        self.timings["fetch_s"] += time.perf_counter() - t0
        return docs

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """Top-k hits per query, best first."""
        if not queries:
            return []
        scores, ids = self.search_ids(queries, topk)
        docs = self.fetch(ids)
        return [[Hit(int(i), float(s), docs[int(i)]) for s, i in zip(srow, irow, strict=True) if i >= 0 and int(i) in docs]
                for srow, irow in zip(scores, ids, strict=True)]

    def stats(self) -> dict[str, Any]:
        return {"queries": self.queries, "docs": self.size, "query_cache": {
            "hits": self.query_cache.hits, "misses": self.query_cache.misses, "size": len(self.query_cache),
            "capacity": self.query_cache.capacity}, **{k: round(v, 4) for k, v in self.timings.items()}}
