"""The reference servers of benchmarks/retrieval_service.py (Search-R1's and ASearcher's designs), and the
encoder's own ceiling: what any server could reach at c=64 on this machine at a given precision.

Both references load what ours loads (the index, tools/encoder.py's encoder at the same dtype, the document
store) with as many threads in all as ours uses.
"""

import multiprocessing
import threading
import time
from pathlib import Path


def _load(index_dir: str, threads: int, dtype: str):
    """What both references load: the index, our encoder (at `dtype`) and document store, `threads` threads."""
    import faiss

    from tools.docstore import DocStore
    from tools.encoder import Encoder
    from tools.index import read_meta

    faiss.omp_set_num_threads(threads)
    encoder = Encoder(threads=threads, dtype=dtype, **read_meta(index_dir)["encoder"])
    index = faiss.read_index(str(Path(index_dir) / "index.faiss"))
    encoder.encode(["warm up"])
    return encoder, index, DocStore(Path(index_dir) / "docs.sqlite")


def _stats_stub(app) -> None:
    @app.get("/stats")
    async def stats():
        return {"query_cache": {"hits": 0}, "batching": {"batches": 0, "queries": 0}}


def search_r1_app(index_dir: str, threads: int, dtype: str = "float32"):
    """Search-R1's server design: a synchronous endpoint (FastAPI runs it on the anyio thread pool),
    one batch search per request (encode the request's queries, search, fetch), a dict response."""
    from fastapi import FastAPI

    from serving.servers.retrieval_server import QueryRequest  # the same request schema (Search-R1's)

    encoder, index, docs = _load(index_dir, threads, dtype)

    def batch_search(queries: list[str], k: int) -> tuple[list[list[dict]], list[list[float]]]:
        emb = encoder.encode(queries, kind="query")
        scores, ids = index.search(emb, k)
        found = docs.get_many(int(i) for i in ids.ravel() if i >= 0)
        results = [[found[int(i)] for i in row if i >= 0] for row in ids.tolist()]
        return results, scores.tolist()

    app = FastAPI()

    @app.post("/retrieve")
    def retrieve(req: QueryRequest):  # plain def: runs on Starlette's thread pool, many at once
        results, scores = batch_search(req.queries, req.topk or 3)
        if not req.return_scores:
            return {"result": results}
        return {"result": [[{"document": d, "score": s} for d, s in zip(row, srow, strict=False)]
                           for row, srow in zip(results, scores, strict=True)]}

    _stats_stub(app)
    return app


def asearcher_app(index_dir: str, threads: int, dtype: str = "float32"):
    """ASearcher's local retrieval server design: an `async def` handler under a global lock."""
    from fastapi import FastAPI

    from serving.servers.retrieval_server import QueryRequest

    encoder, index, docs = _load(index_dir, threads, dtype)
    lock = threading.Lock()
    app = FastAPI()

    @app.post("/retrieve")
    async def retrieve(req: QueryRequest):
        with lock:  # blocks the event loop while it works, like the peer
            emb = encoder.encode(req.queries, kind="query")
            scores, ids = index.search(emb, req.topk or 3)
            found = docs.get_many(int(i) for i in ids.ravel() if i >= 0)
            result = [[{"document": found[int(i)], "score": float(s)} if req.return_scores else found[int(i)]
                       for s, i in zip(srow, irow, strict=True) if i >= 0] for srow, irow in zip(scores, ids, strict=True)]
        return {"result": result}

    _stats_stub(app)
    return app


def _ceiling_worker(index_dir: str, queries: list[str], dtype: str, batch: int, start, out) -> None:
    """One core's share: load (one torch and FAISS thread), wait for the others, then encode + search
    `queries` in batches of `batch`."""
    encoder, index, _ = _load(index_dir, 1, dtype)
    start.wait()
    t0 = time.perf_counter()
    for i in range(0, len(queries), batch):
        index.search(encoder.encode(queries[i:i + batch], kind="query"), 3)
    out.put(time.perf_counter() - t0)


def encoder_ceiling(index_dir: str, queries: list[str], cores: int, dtype: str, batch: int = 64) -> float:
    """Queries/s of the encoder and FAISS alone, with no HTTP at all: `cores` single-threaded processes,
    each encoding and searching its share of `queries` in full batches at once. No server can answer the
    c=64 phase faster than this at this precision, whatever its design: it is the compute it must do."""
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(cores), ctx.Queue()
    share = -(-len(queries) // cores)
    procs = [ctx.Process(target=_ceiling_worker, args=(index_dir, queries[i * share:(i + 1) * share], dtype, batch,
                                                       start, out)) for i in range(cores)]
    for p in procs:
        p.start()
    elapsed = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    return len(queries) / max(elapsed)
