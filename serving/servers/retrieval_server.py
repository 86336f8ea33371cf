"""The retrieval service: Search-R1's `/retrieve` and ASearcher's `/access`, batched across requests.

    hexsearch serve retrieval --index idx/ --port 8000

Wire format (unchanged from the peers, so their clients work as they are):

    POST /retrieve {"queries": [str, ...], "topk": k?, "return_scores": bool?}
      return_scores=true  -> {"result": [[{"document": row, "score": s}, ...] per query]}
      return_scores=false -> {"result": [[row, ...] per query]}
      (`row` is the corpus line as given, e.g. {"id", "title", "url", "contents"}; topk defaults
      to the server's --topk; any number of queries, including 0 and 2, works either way.)
    POST /access {"urls": [str, ...]} -> {"result": [page row or null, ...]}
    GET /health -> {"status": "ok", "docs", "dim", "index_type", "encoder"}
    GET /stats  -> requests, queries, batch-size histogram, latency p50/p90/p99, query-cache hits

All model and FAISS work runs in worker processes (tools/runners.py; one batch in flight per
process), fed batches by the batcher (tools/batcher.py); page lookups run in the thread pool; handlers only
await, so the event loop never blocks and never fights the encoder for the GIL.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import deque
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError

from serving.servers.http_guard import BodyLimit, send_json
from tools.base import percentiles
from tools.batcher import RetrievalBatcher
from tools.docstore import PageStore
from tools.encoder import resolve_encoder_dtype
from tools.index import read_meta
from tools.retriever import Retriever
from tools.runners import ProcessRunner, ThreadRunner, default_workers

MAX_TOPK = 1000
MAX_QUERIES = 1024
"""Most queries (or urls) in one request."""
MAX_QUERY_CHARS = 4096
"""Longest query."""
MAX_RESULTS = 100_000
"""Most queries x topk in one request (what the response holds)."""
MAX_BODY_BYTES = 8 << 20
"""Largest request body; larger ones get 413 (readable by the client: serving/servers/http_guard.py) before any of it
is parsed."""


class FastPath:
    """ASGI middleware: answer `POST <path>` straight from `handler(body) -> JSON-able` (HTTPException for
    errors, as FastAPI renders them), every other request goes on to the app.

    Why: at 64 single-query clients the HTTP process's CPU is taken from the encoder workers on the same
    cores, and most of it went to FastAPI's routing, dependency solving and response classes, not to the
    request itself (profiled with py-spy). The route stays declared on the app for its schema."""

    def __init__(self, app: Any, path: str, handler: Any):
        self.app, self.path, self.handler = app, path, handler

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != self.path or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        try:
            status, payload = 200, await self.handler(b"".join(chunks))
        except HTTPException as e:
            status, payload = e.status_code, {"detail": e.detail}
        await send_json(send, status, payload)


def _check_request(queries: list[str], topk: int) -> None:
    """422 for a request over the limits (see MAX_* above), with what was asked and the limit."""
    if not 1 <= topk <= MAX_TOPK:
        raise HTTPException(status_code=422, detail=f"topk must be between 1 and {MAX_TOPK}, got {topk}")
    if len(queries) > MAX_QUERIES:
        raise HTTPException(status_code=422, detail=f"{len(queries)} queries in one request; at most {MAX_QUERIES}")
    longest = max((len(q) for q in queries), default=0)
    if longest > MAX_QUERY_CHARS:
        raise HTTPException(status_code=422, detail=f"a query of {longest} characters; at most {MAX_QUERY_CHARS}")
    if len(queries) * topk > MAX_RESULTS:
        raise HTTPException(status_code=422, detail=f"{len(queries)} queries x topk {topk} = "
                                                    f"{len(queries) * topk} results; at most {MAX_RESULTS}")


class QueryRequest(BaseModel):
    queries: list[str]
    topk: int | None = Field(default=None)
    return_scores: bool = False


class AccessRequest(BaseModel):
    urls: list[str]


def _parse_body(model: type[BaseModel], body: bytes) -> Any:
    """The request body validated in one pydantic-core pass (422 with pydantic's errors otherwise).

    The hot endpoints read the raw body instead of declaring a FastAPI body parameter: FastAPI's
    dependency solving and its separate JSON decode cost more per request than the validation itself,
    and at 64 single-query clients that overhead competes with the encoder for the same cores.
    """
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        raise HTTPException(status_code=422, detail=json.loads(e.json(include_url=False))) from None


class _Latency:
    """Rolling latency window (last 20k requests) per endpoint."""

    def __init__(self) -> None:
        self.values: dict[str, deque[float]] = {}
        self.counts: dict[str, int] = {}

    def add(self, endpoint: str, seconds: float) -> None:
        self.values.setdefault(endpoint, deque(maxlen=20_000)).append(seconds)
        self.counts[endpoint] = self.counts.get(endpoint, 0) + 1

    def summary(self, endpoint: str) -> dict[str, float]:
        p50, p90, p99 = percentiles(self.values.get(endpoint, ()), (0.5, 0.9, 0.99))
        return {"requests": self.counts.get(endpoint, 0), "p50_ms": round(1000 * p50, 3),
                "p90_ms": round(1000 * p90, 3), "p99_ms": round(1000 * p99, 3)}


def create_app(source: Retriever | str | Path, *, default_topk: int = 3, max_batch: int = 64,
               max_wait_ms: float = 2.0, worker: str = "process", workers: int = 0,
               **retriever_kwargs: Any) -> FastAPI:
    """FastAPI app serving an index (see the module docstring).

    `source` is an index folder — loaded by `workers` worker processes (`worker="process"`, the
    default; 0 workers: one per core, at most 4) or in this process on a worker thread
    (`worker="thread"`) — or an already-loaded Retriever (thread).
    `retriever_kwargs` (threads, query_cache_size, encoder_dtype, ...) go to the Retriever the worker builds.
    """
    encoder_dtype = str(retriever_kwargs.get("encoder_dtype", "float32"))
    resolve_encoder_dtype(encoder_dtype)  # a bad name fails here, with the valid ones, not in a worker
    if isinstance(source, Retriever):
        runner: Any = ThreadRunner(source)
        index_dir, pages, encoder_dtype = source.index_dir, source.pages, source.encoder.dtype
    else:
        index_dir = Path(source)
        read_meta(index_dir)  # fail here, with a clear message, not in the worker
        retriever_kwargs.setdefault("batch_size", max_batch)
        if worker == "process":
            runner = ProcessRunner(index_dir, workers=workers or default_workers(), **retriever_kwargs)
        elif worker == "thread":
            runner = ThreadRunner(Retriever(index_dir, **retriever_kwargs))
        else:
            raise ValueError(f"worker must be 'process' or 'thread', got {worker!r}")
        pages = PageStore(index_dir / "pages.sqlite") if (index_dir / "pages.sqlite").exists() else None
    meta = read_meta(index_dir)
    batcher = RetrievalBatcher(runner, max_batch=max_batch, max_wait_ms=max_wait_ms)
    latency = _Latency()
    started = time.time()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await batcher.warmup()
        yield
        await batcher.aclose()

    app = FastAPI(title="hexsearch retrieval", lifespan=lifespan)
    app.state.batcher = batcher

    async def retrieve_body(body: bytes) -> Any:
        """The whole /retrieve answer for a raw request body (HTTPException for a bad one)."""
        t0 = time.perf_counter()
        req = _parse_body(QueryRequest, body)
        topk = default_topk if req.topk is None else req.topk
        _check_request(req.queries, topk)
        try:
            hits = await batcher.search(req.queries, topk)
        except Exception as e:  # noqa: BLE001 - a dead/failed worker is the server's problem: 503, retryable
            raise HTTPException(status_code=503, detail=f"retrieval failed: {type(e).__name__}: {e}") from e
        if req.return_scores:
            result: list[Any] = [[{"document": h.doc, "score": h.score} for h in row] for row in hits]
        else:
            result = [[h.doc for h in row] for row in hits]
        latency.add("retrieve", time.perf_counter() - t0)
        return {"result": result}

    @app.post("/retrieve")
    async def retrieve(request: Request) -> JSONResponse:  # for the schema; FastPath answers first
        return JSONResponse(await retrieve_body(await request.body()))

    app.add_middleware(FastPath, path="/retrieve", handler=retrieve_body)
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)  # added last: outermost, so the fast path sees only bodies within the limit

    @app.post("/access")
    async def access(request: Request) -> JSONResponse:
        t0 = time.perf_counter()
        req = _parse_body(AccessRequest, await request.body())
        if len(req.urls) > MAX_QUERIES:
            raise HTTPException(status_code=422, detail=f"{len(req.urls)} urls in one request; at most {MAX_QUERIES}")
        if pages is None:
            result: list[Any] = [None] * len(req.urls)
        else:
            result = await asyncio.to_thread(lambda: [pages.get(u) for u in req.urls])
        latency.add("access", time.perf_counter() - t0)
        return JSONResponse({"result": result})

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "docs": meta["count"], "dim": meta["dim"], "index_type": meta["index_type"],
                "encoder": meta["encoder"]["spec"], "encoder_dtype": encoder_dtype, "pages": pages is not None}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        r = runner.stats()
        return {"uptime_s": round(time.time() - started, 1), "queries": batcher.batched_queries,
                "retrieve": latency.summary("retrieve"), "access": latency.summary("access"),
                "batching": batcher.stats(), "query_cache": r.get("query_cache", {}),
                "time_s": {k: r.get(k, 0.0) for k in ("encode_s", "search_s", "fetch_s")},
                "batches_by_threads": r.get("batches_by_threads", {}),
                "max_batch": batcher.max_batch, "max_wait_ms": batcher.max_wait_s * 1000,
                "worker": type(runner).__name__, "workers_replaced": r.get("workers_replaced", 0)}

    return app


def listen_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket for uvicorn. Made with the TCP protocol number: asyncio sets TCP_NODELAY on accepted
    connections only when `sock.proto == IPPROTO_TCP`, and without it every answer on a reused connection
    waits for the client's delayed ACK (~40 ms per request at one client)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


class ServerThread:
    """Run an ASGI app with uvicorn in a background thread on a free loopback port (tests, benchmarks).

        with ServerThread(app) as srv:
            httpx.post(srv.url + "/retrieve", json=...)
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        self.sock = listen_socket(host, port)
        self.host, self.port = host, self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False))
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                        name="uvicorn", daemon=True)

    def __enter__(self) -> ServerThread:
        self._thread.start()
        deadline = time.time() + 120
        while not self.server.started:
            if not self._thread.is_alive() or time.time() > deadline:
                raise RuntimeError(f"server on {self.url} failed to start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)
        self.sock.close()


def run_retrieval_server(index_dir: str | Path, *, host: str = "127.0.0.1", port: int = 8000, default_topk: int = 3,
                         max_batch: int = 64, max_wait_ms: float = 2.0, threads: int = 0, worker: str = "process",
                         workers: int = 0, query_cache_size: int = 10_000, encoder_dtype: str = "float32",
                         addr_file: str | Path | None = None, on_ready: Any = None) -> None:
    """Serve an index until interrupted; writes `host:port` to `addr_file` once listening and warm."""
    import uvicorn

    app = create_app(index_dir, default_topk=default_topk, max_batch=max_batch, max_wait_ms=max_wait_ms,
                     worker=worker, workers=workers, threads=threads, query_cache_size=query_cache_size,
                     encoder_dtype=encoder_dtype)
    sock = listen_socket(host, port)
    bound = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False))

    async def main() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            if addr_file:
                tmp = Path(f"{addr_file}.tmp")
                tmp.write_text(f"{host}:{bound}\n")
                tmp.replace(addr_file)
            if on_ready:
                on_ready(host, bound, read_meta(index_dir))
        await task

    asyncio.run(main())
