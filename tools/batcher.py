"""Cross-request micro-batching for retrieval: many callers, one encoder pass, one FAISS search.

Search-R1's server (and every copy of it) handles each HTTP request on its own; with agents that
send one query per request, the encoder then runs at batch size 1, where per-call overhead
dominates. The batcher puts every query of every request into one pending list; a collector
task takes up to `max_batch` of them — waiting at most `max_wait_ms` after the first arrival
for company, but only while another batch is running (so a lone client never waits: its request goes
at once, and whatever arrives meanwhile forms the next batch), and not at all when a backlog is
already there — and hands the whole batch to a
runner (tools/runners.py: a worker process or thread that encodes once, searches once per
distinct top-k and fetches documents once; or, client-side, one HTTP request to a retrieval
service carrying every query — tools/search.py). While the runner computes, new requests
queue up and form the next batch, so batch size grows with load on its own. A runner with
several workers (`parallelism`) gets one batch per worker in flight; when several workers are
idle, the queue is split evenly between them. The event loop never runs model code, so handlers
stay responsive.

The collector runs on the event loop that first calls `search`; one batcher serves one loop.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from tools.retriever import Hit, Retriever
from tools.runners import ThreadRunner


@dataclass
class _Item:
    query: str
    topk: int
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)


def bucket(n: int) -> str:
    """Histogram bucket label of a batch size: 1, 2-3, 4-7, 8-15, ..."""
    lo = 1 << (n.bit_length() - 1)
    return str(lo) if lo == 1 else f"{lo}-{2 * lo - 1}"


class RetrievalBatcher:
    """`await batcher.search(queries, topk)` -> hits per query, batched across concurrent callers.

    `source` is a loaded Retriever (run on a worker thread) or a runner: any object with
    `async run([(query, topk), ...]) -> [hits, ...]`, `async warmup()`, `stats()` and `async aclose()`.
    """

    def __init__(self, source: Retriever | Any, *, max_batch: int = 64, max_wait_ms: float = 2.0):
        self.runner = ThreadRunner(source) if isinstance(source, Retriever) else source
        self.max_batch = max(1, max_batch)
        self.max_wait_s = max(0.0, max_wait_ms) / 1000.0
        self._pending: list[_Item] = []
        self._arrived: asyncio.Event | None = None
        self._full: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self.batches = 0
        self.batched_queries = 0
        self.histogram: dict[str, int] = {}
        self.queue_wait_s = 0.0
        self.compute_s = 0.0
        self.in_flight = 0
        """Batches handed to the runner and not yet finished (at most the runner's `parallelism`)."""
        self.peak_in_flight = 0

    def _ensure_started(self) -> None:
        if self._task is None or self._task.done():
            self._arrived, self._full = asyncio.Event(), asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._collect(), name="retrieval-batcher")

    async def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """Hits for each query (best first); waits for the batch that carries them."""
        if not queries:
            return []
        self._ensure_started()
        loop = asyncio.get_running_loop()
        items = [_Item(q, topk, loop.create_future()) for q in queries]
        self._pending.extend(items)
        assert self._arrived is not None and self._full is not None
        self._arrived.set()
        if len(self._pending) >= self.max_batch:
            self._full.set()
        return list(await asyncio.gather(*(it.future for it in items)))

    async def _collect(self) -> None:
        assert self._arrived is not None and self._full is not None
        # One batch in flight per runner worker; a batch is formed only when a worker is free, so it
        # takes what queued meanwhile -- its share of it when several workers are free, so that a
        # burst is split between idle workers instead of going to one while the others wait.
        workers = getattr(self.runner, "parallelism", 1)
        free = asyncio.Semaphore(workers)
        running: set[asyncio.Task] = set()
        split = False  # the last batch was one share of a burst cut for several idle workers
        while True:
            await free.acquire()
            await self._arrived.wait()
            if len(self._pending) < self.max_batch and self.max_wait_s > 0 and self.in_flight and not split:
                try:
                    await asyncio.wait_for(self._full.wait(), self.max_wait_s)
                except TimeoutError:
                    pass
            idle = workers - self.in_flight  # this worker and the others free now (>= 1: we hold a slot)
            take = min(self.max_batch, -(-len(self._pending) // idle))
            split = idle > 1 and take < len(self._pending)  # the other shares go at once, together
            batch = [it for it in self._pending[:take] if not it.future.done()]
            del self._pending[:take]
            if not self._pending:
                self._arrived.clear()
            if len(self._pending) < self.max_batch:
                self._full.clear()
            if not batch:
                free.release()
                continue
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            task = asyncio.get_running_loop().create_task(self._run(batch, free))
            running.add(task)  # a reference, so the task is not garbage-collected while it runs
            task.add_done_callback(running.discard)

    async def _run(self, batch: list[_Item], free: asyncio.Semaphore) -> None:
        t0 = time.perf_counter()
        try:
            results = await self.runner.run([(it.query, it.topk) for it in batch])
        except Exception as exc:  # noqa: BLE001 - hand the failure to every waiting caller
            for it in batch:
                if not it.future.done():
                    it.future.set_exception(exc)
            return
        finally:
            self.in_flight -= 1
            free.release()
        self._account(batch, t0)
        for it, hits in zip(batch, results, strict=True):
            if not it.future.done():
                it.future.set_result(hits)

    def _account(self, batch: list[_Item], started: float) -> None:
        n = len(batch)
        self.batches += 1
        self.batched_queries += n
        self.histogram[bucket(n)] = self.histogram.get(bucket(n), 0) + 1
        self.queue_wait_s += sum(started - it.enqueued for it in batch)
        self.compute_s += time.perf_counter() - started

    def stats(self) -> dict[str, Any]:
        return {"batches": self.batches, "queries": self.batched_queries,
                "mean_batch_size": self.batched_queries / self.batches if self.batches else 0.0,
                "batch_size_histogram": dict(sorted(self.histogram.items(), key=lambda kv: int(kv[0].split("-")[0]))),
                "mean_queue_wait_ms": 1000 * self.queue_wait_s / max(1, self.batched_queries),
                "peak_in_flight": self.peak_in_flight,
                "compute_s": round(self.compute_s, 4)}

    async def warmup(self) -> None:
        """Load and exercise the encoder before the first real request."""
        await self.runner.warmup()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
            self._task = None
        for it in self._pending:
            if not it.future.done():
                it.future.cancel()
        self._pending.clear()
        await self.runner.aclose()
