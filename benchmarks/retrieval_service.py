"""Retrieval service throughput: our cross-request batched service vs a one-request-at-a-time reference.

Both servers load the same index folder (a FAISS index over a generated world) and the same
encoder (the packaged MiniLM, fp32), and each runs in its own process while the other is down.
The reference handles each request under a global lock inside an `async def` handler — exactly
how ASearcher's local retrieval server works (and, for single-query clients, what Search-R1's
per-request server amounts to): encode the request's queries, search, fetch documents.

Load: `--clients` concurrent clients (64) each sending one query per request until `--requests`
requests are done. Every query is distinct and unseen (warm-up uses other queries), so our query
cache cannot inflate the figure; the run checks that its hit count did not move. Top-k ids must be
identical for every query (a swap between two documents whose scores tie within 1e-5 is reported
separately as a tie, not hidden).

    python benchmarks/retrieval_service.py [--requests 1024] [--clients 64] [--rounds 3] [--entities 400]

Rounds alternate the order (reference first, then ours first, ...) and figures are medians over
rounds, so background load that drifts during the run biases neither side.

Prints `RESULT retrieval_service ratio=<ours QPS / reference QPS> p50=... p99=...` and writes
benchmarks/results/retrieval_service.json.
"""

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


# -- the reference server (ASearcher-style: one request at a time under a lock) -------------------

def reference_app(index_dir: str, threads: int):
    import faiss
    from fastapi import FastAPI

    from serving.retrieval_server import QueryRequest  # the same request schema (Search-R1's)
    from tools.docstore import DocStore
    from tools.encoder import Encoder
    from tools.index import read_meta

    meta = read_meta(index_dir)
    encoder = Encoder(threads=threads, **meta["encoder"])
    index = faiss.read_index(str(Path(index_dir) / "index.faiss"))
    docs = DocStore(Path(index_dir) / "docs.sqlite")
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

    @app.get("/stats")
    async def stats():
        return {"query_cache": {"hits": 0}, "batching": {"mean_batch_size": 1.0}}

    encoder.encode(["warm up"])
    return app


def serve(kind: str, index_dir: str, addr_file: str, threads: int, max_batch: int, max_wait_ms: float) -> None:
    from serving.retrieval_server import ServerThread, create_app

    if kind == "ours":
        app = create_app(index_dir, max_batch=max_batch, max_wait_ms=max_wait_ms, threads=threads)
    else:
        app = reference_app(index_dir, threads)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # shut down cleanly (stops our worker process)
    with ServerThread(app) as srv:
        tmp = Path(f"{addr_file}.tmp")
        tmp.write_text(srv.url)
        tmp.replace(addr_file)  # atomic: the parent never reads a half-written address
        while True:
            time.sleep(3600)


# -- the load generator ---------------------------------------------------------------------------

class Connection:
    """One keep-alive HTTP/1.1 connection speaking JSON: a lightweight load-generating client.

    httpx's shared connection pool costs so much CPU per request that on 2 cores it cannot keep
    64 requests in flight (the server saw 2-3 at a time); 64 plain connections model 64
    independent agents and leave the CPU to the servers under test.
    """

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, obj: dict) -> dict:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        body = json.dumps(obj).encode()
        self.writer.write(f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        await self.writer.drain()
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split(" ", 2)[1])
        length = next(int(line.split(":", 1)[1]) for line in head[1:] if line.lower().startswith("content-length:"))
        data = await self.reader.readexactly(length)
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {data[:200]!r}")
        return json.loads(data)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def hammer(url: str, queries: list[str], clients: int, topk: int) -> tuple[float, list[float], dict]:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    todo = list(enumerate(queries))
    results: dict[int, list] = {}
    latencies: list[float] = []

    async def client() -> None:
        conn = Connection(host, int(port))
        try:
            while todo:
                i, q = todo.pop()
                t0 = time.perf_counter()
                body = await conn.post("/retrieve", {"queries": [q], "topk": topk, "return_scores": True})
                latencies.append(time.perf_counter() - t0)
                results[i] = body["result"][0]
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return time.perf_counter() - t0, latencies, results


def run_server(kind: str, args, index_dir: Path, warm: list[str], queries: list[str]) -> dict:
    import httpx

    from tools.base import percentiles

    addr = Path(args.out).with_suffix(f".{kind}.addr")
    addr.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, __file__, "--serve", kind, "--index", str(index_dir), "--addr-file",
                             str(addr), "--threads", str(args.threads), "--max-batch", str(args.max_batch),
                             "--max-wait-ms", str(args.max_wait_ms)], env=dict(os.environ, HEXSEARCH_QUIET="1"))
    try:
        while not addr.exists():
            if proc.poll() is not None:
                raise SystemExit(f"{kind} server exited with {proc.returncode}")
            time.sleep(0.1)
        url = addr.read_text().strip()
        asyncio.run(hammer(url, warm, min(args.clients, len(warm)), args.topk))
        before = httpx.get(url + "/stats").json()
        wall, lat, results = asyncio.run(hammer(url, queries, args.clients, args.topk))
        after = httpx.get(url + "/stats").json()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        addr.unlink(missing_ok=True)
    p50, p90, p99 = percentiles(lat, (0.5, 0.9, 0.99))
    return {"qps": len(queries) / wall, "wall_s": wall, "p50_ms": 1000 * p50, "p90_ms": 1000 * p90,
            "p99_ms": 1000 * p99, "results": results,
            "query_cache_hits": after["query_cache"]["hits"] - before["query_cache"]["hits"],
            "mean_batch_size": after["batching"]["mean_batch_size"]}


def compare(ours: dict[int, list], ref: dict[int, list], n: int) -> dict[str, int]:
    identical = ties = mismatched = 0
    for i in range(n):
        a = [x["document"]["id"] for x in ours[i]]
        b = [x["document"]["id"] for x in ref[i]]
        if a == b:
            identical += 1
            continue
        sa = [x["score"] for x in ours[i]]
        sb = [x["score"] for x in ref[i]]
        # a tie: wherever the lists differ, both put a document with the same score (within 1e-5) there
        tie = len(a) == len(b) and all(abs(sa[j] - sb[j]) < 1e-5 for j in range(len(a)) if a[j] != b[j])
        ties, mismatched = (ties + 1, mismatched) if tie else (ties, mismatched + 1)
    return {"identical": identical, "tie_swaps": ties, "mismatched": mismatched}


def workload(entities: int, n: int, warm: int) -> tuple[Path, list[str], list[str]]:
    from datagen.world import default_world
    from tools.index import default_index

    world = default_world(entities=entities, seed=0)
    index_dir = default_index(world)
    qs: list[str] = []
    for split in ("train", "dev", "test"):
        for line in open(world / f"qa_{split}.jsonl", encoding="utf-8"):
            qs.append(json.loads(line)["question"])
    titles = [json.loads(line)["title"] for line in open(world / "corpus.jsonl", encoding="utf-8")]
    for t in dict.fromkeys(titles):
        qs += [f"What is known about {t}?", f"history of {t}", f"{t} facts"]
    qs = list(dict.fromkeys(qs))
    if len(qs) < n + warm:
        raise SystemExit(f"only {len(qs)} distinct queries for {n} requests + {warm} warm-up; use more --entities")
    return index_dir, qs[n:n + warm], qs[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--topk", type=int, default=3)
    ap.add_argument("--entities", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="rounds, alternating which server goes first")
    ap.add_argument("--threads", type=int, default=0, help="torch/FAISS threads in both servers (0: default)")
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--max-wait-ms", type=float, default=2.0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "retrieval_service.json"))
    ap.add_argument("--serve", choices=["ours", "reference"], help=argparse.SUPPRESS)
    ap.add_argument("--index", help=argparse.SUPPRESS)
    ap.add_argument("--addr-file", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, args.index, args.addr_file, args.threads, args.max_batch, args.max_wait_ms)
        return

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    index_dir, warm, queries = workload(args.entities, args.requests, args.warmup)
    print(f"index {index_dir}; {len(queries)} distinct queries, {args.clients} clients, top-{args.topk}, "
          f"{args.rounds} round(s)", file=sys.stderr)
    runs: dict[str, list[dict]] = {"reference": [], "ours": []}
    for r in range(args.rounds):  # alternate the order (AB, BA, ...) so drifting background load cancels out
        for kind in (("reference", "ours") if r % 2 == 0 else ("ours", "reference")):
            res = run_server(kind, args, index_dir, warm, queries)
            runs[kind].append(res)
            print(f"round {r} {kind:9s}: {res['qps']:.1f} QPS, p50 {res['p50_ms']:.0f} ms, p99 {res['p99_ms']:.0f} ms, "
                  f"mean batch {res['mean_batch_size']:.1f}, load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    check = {"identical": 0, "tie_swaps": 0, "mismatched": 0}
    for ours_run, ref_run in zip(runs["ours"], runs["reference"], strict=True):
        for key, value in compare(ours_run["results"], ref_run["results"], len(queries)).items():
            check[key] += value
    ours, ref = (summarise(runs[k]) for k in ("ours", "reference"))
    ratio = ours["qps"] / ref["qps"]
    out = {"benchmark": "retrieval_service", "ratio": ratio, "ours": ours, "reference": ref, "topk_check": check,
           "rounds": args.rounds, "requests": len(queries), "clients": args.clients, "topk": args.topk,
           "entities": args.entities, "index": str(index_dir), "threads": args.threads, "max_batch": args.max_batch,
           "max_wait_ms": args.max_wait_ms, "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                                        "load_avg": os.getloadavg()},
           "note": "2-core machine shared with other jobs: figures are noisy"}
    Path(args.out).write_text(json.dumps(out, indent=2))
    checked = len(queries) * args.rounds
    if check["mismatched"]:
        print(f"WARNING: {check['mismatched']} queries got different top-{args.topk} ids", file=sys.stderr)
    print(f"RESULT retrieval_service ratio={ratio:.2f} p50={ours['p50_ms']:.0f}ms p99={ours['p99_ms']:.0f}ms "
          f"ours_qps={ours['qps']:.1f} ref_qps={ref['qps']:.1f} ref_p50={ref['p50_ms']:.0f}ms "
          f"ref_p99={ref['p99_ms']:.0f}ms identical={check['identical']}/{checked} ties={check['tie_swaps']} "
          f"mean_batch={ours['mean_batch_size']:.1f} cache_hits={ours['query_cache_hits']}")


def summarise(runs: list[dict]) -> dict:
    """Median QPS/latencies over rounds, plus every round's figures."""
    import statistics

    keys = ("qps", "p50_ms", "p90_ms", "p99_ms", "mean_batch_size")
    out = {k: statistics.median(r[k] for r in runs) for k in keys}
    out["query_cache_hits"] = sum(r["query_cache_hits"] for r in runs)
    out["rounds"] = [{k: r[k] for k in (*keys, "wall_s", "query_cache_hits")} for r in runs]
    return out

if __name__ == "__main__":
    main()
