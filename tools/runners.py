"""Where a retrieval batch is computed: a worker thread, or a worker process (the service default).

Runners feed `tools.batcher.RetrievalBatcher`.

`run_batch` is the work itself: encode all queries of the batch once, one FAISS search per
distinct top-k, one document-store read for every hit id.

Why a process: the encoder's forward pass is a few hundred small torch ops, and between ops
the worker thread must re-take the GIL. In a busy service the event-loop thread holds the GIL
to parse requests and write responses, and CPython hands it over only every `switchinterval`
(5 ms), so a thread worker's forward pass crawls exactly when load is highest (measured: a
32-query encode took 2.5x longer beside one busy Python thread). A separate process has its
own interpreter: the HTTP process never slows the encoder down. `ThreadRunner` remains for
in-process use (tests, an agent sharing an already-loaded Retriever).

In the worker process OMP_WAIT_POLICY defaults to PASSIVE, so idle OpenMP threads sleep instead
of spinning on cores the HTTP process needs.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import time
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tools.retriever import Hit, Retriever

Batch = list[tuple[str, int]]
"""(query, topk) per item."""


def run_batch(retriever: Retriever, batch: Batch) -> list[list[Hit]]:
    """Hits for every (query, topk) of the batch, in order."""
    emb = retriever.encode_queries([q for q, _ in batch])
    by_k: dict[int, list[int]] = {}
    for pos, (_, k) in enumerate(batch):
        by_k.setdefault(max(1, k), []).append(pos)
    found = []
    for k, positions in by_k.items():
        t0 = time.perf_counter()
        scores, ids = retriever.index.search(emb[positions], k)
        retriever.timings["search_s"] += time.perf_counter() - t0
        found.append((positions, scores, ids))
    retriever.queries += len(batch)
    docs = retriever.fetch([i for _, _, ids in found for i in ids.ravel()])
    out: list[list[Hit]] = [[] for _ in batch]
    for positions, scores, ids in found:
        for pos, srow, irow in zip(positions, scores, ids, strict=True):
            out[pos] = [Hit(int(i), float(s), docs[int(i)]) for s, i in zip(srow, irow, strict=True)
                        if i >= 0 and int(i) in docs]
    return out


class ThreadRunner:
    """Runs batches on one worker thread over an in-process Retriever."""

    def __init__(self, retriever: Retriever):
        self.retriever = retriever
        self.executor: Executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retrieval-worker")

    async def run(self, batch: Batch) -> list[list[Hit]]:
        return await asyncio.get_running_loop().run_in_executor(self.executor, run_batch, self.retriever, batch)

    async def warmup(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self.executor, self.retriever.encoder.encode, ["warm up"])

    def stats(self) -> dict[str, Any]:
        return self.retriever.stats()

    async def aclose(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


_WORKER: Retriever | None = None


def _exit_with_parent(parent: int) -> None:
    """Daemon thread: end this worker when the service process is gone (even after SIGKILL)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _init_worker(index_dir: str, kwargs: dict[str, Any]) -> None:
    global _WORKER
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True, name="parent-watch").start()
    _WORKER = Retriever(index_dir, **kwargs)


def _worker_run(batch: Batch) -> tuple[list[list[Hit]], dict[str, Any]]:
    assert _WORKER is not None
    return run_batch(_WORKER, batch), _WORKER.stats()


def _worker_warmup() -> dict[str, Any]:
    assert _WORKER is not None
    _WORKER.encoder.encode(["warm up"])
    return _WORKER.stats()


class ProcessRunner:
    """Runs batches in one spawned worker process that loads the index itself.

    Statistics come back with every batch, so `stats()` never waits behind a running batch.
    """

    def __init__(self, index_dir: str | Path, **retriever_kwargs: Any):
        self.index_dir = str(index_dir)
        self.kwargs = retriever_kwargs
        self.executor = self._new_pool()
        self._stats: dict[str, Any] = {}

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_init_worker, initargs=(self.index_dir, self.kwargs))

    async def run(self, batch: Batch) -> list[list[Hit]]:
        loop = asyncio.get_running_loop()
        try:
            results, self._stats = await loop.run_in_executor(self.executor, _worker_run, batch)
        except Exception:
            if getattr(self.executor, "_broken", False):  # the worker died (e.g. killed): start a new one
                self.executor.shutdown(wait=False, cancel_futures=True)
                self.executor = self._new_pool()
            raise
        return results

    async def warmup(self) -> None:
        self._stats = await asyncio.get_running_loop().run_in_executor(self.executor, _worker_warmup)

    def stats(self) -> dict[str, Any]:
        return dict(self._stats)

    async def aclose(self) -> None:
        """Stop the worker process (after the batch it is running, if any)."""
        await asyncio.to_thread(self.executor.shutdown, wait=True, cancel_futures=True)
