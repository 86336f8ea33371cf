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

Why several processes (`workers`): a BERT-sized encoder does not scale across cores inside one
forward pass (measured on 2 cores: 125 queries/s with one thread, 194-221 with two), and one
worker idles while a finished batch is answered and the next one forms. `workers` single-threaded
processes each encode their own batch, and the batcher keeps one batch in flight per worker. Each
worker memory-maps the index file (`Retriever(mmap=True)`), so the vectors are in memory once.

A batch that finds every other worker idle (a lone client, light load) runs with every core's
thread, so one query is not held to one core while the others sleep (measured: a single query
encodes 1.3x faster with two threads than with one); batches that run beside others get their
share of the cores (`threads`). In the worker process GOMP_SPINCOUNT defaults to 20,000: idle OpenMP
threads spin only briefly before sleeping, so they do not hold cores the HTTP process needs, yet a
two-thread forward pass keeps its speed (OMP_WAIT_POLICY=PASSIVE made every one of its few hundred
parallel regions wake a sleeping thread: a single query then ran no faster on two threads than on one).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import time
from concurrent.futures import Executor, ThreadPoolExecutor
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

    parallelism = 1
    """Batches that may run at once."""

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
    os.environ.setdefault("GOMP_SPINCOUNT", "20000")
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True, name="parent-watch").start()
    _WORKER = Retriever(index_dir, **kwargs)


def _worker_run(batch: Batch, threads: int = 0) -> tuple[list[list[Hit]], int, dict[str, Any], int]:
    """The batch's hits, this worker's pid and statistics, and the threads the batch ran with."""
    import torch

    assert _WORKER is not None
    if threads > 0:
        _set_threads(threads)
    return run_batch(_WORKER, batch), os.getpid(), _WORKER.stats(), torch.get_num_threads()


def _set_threads(n: int) -> None:
    """torch's intra-op threads in this worker (a no-op when already `n`). FAISS keeps its own setting:
    it has its own OpenMP runtime, whose idle threads would spin beside torch's on the same cores, and a
    flat search of one batch is a small part of the work."""
    import torch

    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


def _worker_warmup() -> tuple[int, dict[str, Any]]:
    assert _WORKER is not None
    _WORKER.encoder.encode(["warm up"])
    return os.getpid(), _WORKER.stats()


def merge_stats(per_worker: list[dict[str, Any]]) -> dict[str, Any]:
    """Retriever statistics summed over worker processes (each has its own counters and query cache)."""
    if not per_worker:
        return {}
    out: dict[str, Any] = {k: v for k, v in per_worker[0].items() if k != "query_cache"}
    for st in per_worker[1:]:
        for k, v in st.items():
            if k not in ("query_cache", "docs") and isinstance(v, (int, float)):
                out[k] = round(out.get(k, 0) + v, 4)
    caches = [st.get("query_cache", {}) for st in per_worker]
    out["query_cache"] = {k: sum(c.get(k, 0) for c in caches) for k in ("hits", "misses", "size", "capacity")}
    return out


def default_workers() -> int:
    """Encoder processes for a service on this machine: one per core, at most 4 (each holds a model copy)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(4, cores))


class WorkerDied(RuntimeError):
    """The worker process running a batch exited (killed, out of memory); a new one is already starting."""


class _Worker:
    """One spawned worker process and the pipe to it. The service's event loop reads the pipe itself
    (`loop.add_reader`): no executor threads in between, so a batch's way there and back costs a pipe
    write and a wake-up, not three thread hand-offs under the GIL (a ProcessPoolExecutor took ~4.5 ms
    per round trip here, on top of a ~6.5 ms single-query encode)."""

    def __init__(self, index_dir: str, kwargs: dict[str, Any]):
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=_worker_main, args=(child, index_dir, kwargs), daemon=True,
                                   name="retrieval-worker")
        self.process.start()
        child.close()
        self.future: asyncio.Future | None = None
        """The reply this worker owes (one request in flight at most)."""
        self.replied = False
        self.loop: asyncio.AbstractEventLoop | None = None

    def close(self) -> None:
        if self.loop is not None and not self.loop.is_closed():
            self.loop.remove_reader(self.conn.fileno())
        self.conn.close()


def _worker_main(conn: Any, index_dir: str, kwargs: dict[str, Any]) -> None:
    """A worker process: load the index, then answer ("run" | "warmup", args) messages until the pipe closes."""
    _init_worker(index_dir, kwargs)
    calls = {"run": _worker_run, "warmup": _worker_warmup}
    while True:
        try:
            kind, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply: tuple[str, Any] = ("ok", calls[kind](*args))
        except Exception as e:  # noqa: BLE001 - the batch fails, the worker lives on
            reply = ("error", RuntimeError(f"{type(e).__name__}: {e}"))
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):  # the service closed the pipe (shutting down)
            return


class ProcessRunner:
    """Runs batches in `workers` spawned processes that each load (memory-map) the index themselves.

    Each worker has one pipe, read by the event loop; a worker that exits is replaced at once (its batch,
    if it had one, fails with `WorkerDied`, which the service answers with a retryable 503).
    Statistics come back with every batch, so `stats()` never waits behind a running batch.
    """

    def __init__(self, index_dir: str | Path, workers: int = 1, **retriever_kwargs: Any):
        self.index_dir = str(index_dir)
        self.parallelism = max(1, workers)
        """Batches that may run at once (one per worker process)."""
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.solo_threads = 0
        """Threads of a batch that runs alone (0: keep the worker's own setting)."""
        if self.parallelism > 1:
            retriever_kwargs.setdefault("mmap", True)
            if not retriever_kwargs.get("threads"):  # split the cores between the workers
                retriever_kwargs["threads"] = max(1, cores // self.parallelism)
                self.solo_threads = cores
        self.shared_threads = retriever_kwargs.get("threads", 0)
        self.busy = 0
        """Batches running now."""
        self.batches_by_threads: dict[int, int] = {}
        """How many batches ran with how many threads (as the worker reported)."""
        self.replaced = 0
        """Workers that exited and were started anew."""
        self.startup_failures = 0
        """Workers in a row that exited before answering anything."""
        self.broken = ""
        """Why no worker is started any more (set after 3 startup failures in a row)."""
        self.kwargs = retriever_kwargs
        self.workers = [_Worker(self.index_dir, self.kwargs) for _ in range(self.parallelism)]
        self._stats: dict[int, dict[str, Any]] = {}

    def pids(self) -> list[int]:
        return [w.process.pid for w in self.workers if w.process.pid is not None]

    def _watch(self, worker: _Worker) -> None:
        """Read this worker's pipe on the running loop (once per worker)."""
        if worker.loop is None:
            worker.loop = asyncio.get_running_loop()
            worker.loop.add_reader(worker.conn.fileno(), self._on_readable, worker)
            # uvloop makes a watched fd non-blocking; Connection.recv/send need a blocking one, or a reply
            # larger than the pipe's buffer is read half and fails with BlockingIOError
            os.set_blocking(worker.conn.fileno(), True)

    def _on_readable(self, worker: _Worker) -> None:
        try:
            status, value = worker.conn.recv()
        except (EOFError, OSError):  # the process is gone
            self._replace(worker)
            return
        future, worker.future = worker.future, None
        worker.replied = True
        if future is not None and not future.done():
            if status == "ok":
                future.set_result(value)
            else:
                future.set_exception(value)

    def _replace(self, worker: _Worker) -> None:
        worker.close()
        worker.process.join(timeout=1.0)
        code = worker.process.exitcode
        self._stats.pop(worker.process.pid or -1, None)
        self.startup_failures = 0 if worker.replied else self.startup_failures + 1
        if self.startup_failures >= 3:  # workers die before answering anything: starting more will not help
            self.broken = f"{self.startup_failures} worker processes exited while starting (last code {code})"
        else:
            fresh = _Worker(self.index_dir, self.kwargs)
            self.workers[self.workers.index(worker)] = fresh
            self.replaced += 1
            self._watch(fresh)
        if worker.future is not None and not worker.future.done():
            worker.future.set_exception(WorkerDied(self.broken or f"worker process {worker.process.pid} exited "
                                                   f"(code {code}) while running this batch; a new one is starting"))

    async def _call(self, kind: str, args: tuple) -> Any:
        if self.broken:
            raise WorkerDied(self.broken)
        for w in self.workers:
            self._watch(w)
        worker = next(w for w in self.workers if w.future is None)  # the batcher never over-commits
        worker.future = asyncio.get_running_loop().create_future()
        future = worker.future
        try:
            worker.conn.send((kind, args))
        except (BrokenPipeError, OSError):
            self._replace(worker)
        return await future

    async def run(self, batch: Batch) -> list[list[Hit]]:
        self.busy += 1
        try:
            if self.solo_threads:
                await asyncio.sleep(0)  # batches handed out in the same tick (a burst split) see each other
            threads = self.solo_threads if self.solo_threads and self.busy == 1 else self.shared_threads
            results, pid, self._stats[pid], used = await self._call("run", (batch, threads))
            self.batches_by_threads[used] = self.batches_by_threads.get(used, 0) + 1
        finally:
            self.busy -= 1
        return results

    async def warmup(self) -> None:
        """Wait until every worker process has loaded and run its encoder once."""
        for pid, st in await asyncio.gather(*(self._call("warmup", ()) for _ in range(self.parallelism))):
            self._stats[pid] = st

    def stats(self) -> dict[str, Any]:
        return {**merge_stats(list(self._stats.values())), "batches_by_threads": dict(self.batches_by_threads),
                "workers_replaced": self.replaced}

    async def aclose(self) -> None:
        """Stop the worker processes (each after the batch it is running, if any)."""
        for w in self.workers:
            w.close()  # the worker's recv sees EOF and it returns

        def join() -> None:
            for w in self.workers:
                w.process.join(timeout=30)
                if w.process.is_alive():
                    w.process.terminate()

        await asyncio.to_thread(join)
