"""Retrieval service throughput: our cross-request batched service vs Search-R1's and ASearcher's server designs.

Every server loads the same index folder (a FAISS flat index over a generated world), the same encoder
(tools/encoder.py, the packaged MiniLM, at the same precision: fp32, or `--encoder-dtype bfloat16` for all),
the same document store, and uses as many torch/FAISS threads in all as ours (one per core); each runs in
its own process while the others are down. The reference servers are in benchmarks/_retrieval_refs.py.

- `ours`: serving/servers/retrieval_server.py as `hexsearch serve retrieval` runs it: worker processes (one
  per core, single-threaded), cross-request batching (max_batch 64, max_wait 2 ms).
- `search-r1`: Search-R1's `retrieval_server.py` design: a plain `def` FastAPI endpoint, so Starlette
  runs each request on its anyio thread pool (40 threads), which encodes that request's queries as one
  batch, runs one FAISS search on it and fetches the documents; no batching across requests, one process,
  the response dict serialised by FastAPI. (Its per-request tqdm bar is left out, in its favour.)
- `asearcher`: ASearcher's local retrieval server: an `async def` handler doing the same work under
  a global lock, so one request at a time and the event loop blocked while it works.
- attribution, ours with one part taken away: `ours-nobatch` (worker processes, max_batch 1: no
  cross-request batching) and `ours-thread` (batching, the encoder on a thread of the HTTP process
  with every core's thread: no worker processes). ours / ours-nobatch is what batching brings,
  ours / ours-thread what worker processes bring.

Each server is measured in three phases, with distinct queries that it has not seen (warm-up uses
others; our query cache is checked not to have hit):
- c=1: one client sending single-query requests one after another (`--c1-requests`);
- c=64: `--clients` concurrent clients, one keep-alive connection and one query per request each
  (`--requests` in all);
- batch64: one client sending requests of `--batch-size` queries one after another (`--batch-requests`).
The phases take consecutive slices of the query list (c=64 mostly the world's questions, batch64 mostly
short title queries), so q/s compare across servers, not across phases.
Top-k ids of every other server must equal ours for every query (a swap of two documents whose
scores tie within 1e-5, or 5e-3 in bf16, where scores move with the batch's shape, is counted as a tie,
not hidden).

The load generator (benchmarks/_http_load.py) is one asyncio process with plain keep-alive HTTP/1.1
connections; its own CPU time (time.process_time) is reported per phase as a share of one core
(`client_cpu`), beside the CPU the server's process tree used (`server_cores`), so that a client that
measures itself shows.

The ceiling: before each round, the encoder and FAISS alone (no HTTP, no server) encode and search the
c=64 phase's queries in batches of 64, one single-threaded process per core (`_retrieval_refs.encoder_ceiling`).
No server design answers the c=64 phase faster at that precision on this machine; `of_ceiling` is ours
over it, `ceiling_ratio` the ceiling over the Search-R1-style reference (the most any server could show).

Rounds alternate the servers' order (forward, then reversed, ...); ratios are taken per round and
reported as the median with min and max over rounds.

    .venv/bin/python benchmarks/retrieval_service.py [--rounds 3] [--requests 1024] [--clients 64]
        [--servers ours,search-r1,asearcher,ours-nobatch,ours-thread] [--encoder-dtype float32|bfloat16]

Prints `RESULT retrieval_service ratio=<ours / search-r1 QPS at c=64> c1_ratio=... batch64_ratio=...
vs_asearcher=... batching_gain=... process_gain=... of_ceiling=... ceiling_ratio=... identical_topk=...
client_cpu=...` (each as its median, followed by `<key>_range=<min>-<max>`) and writes
benchmarks/results/retrieval_service.json (`RESULT retrieval_service_bf16` and its own record with bfloat16).
"""

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import kv, spread, write_result  # noqa: E402
from _http_load import hammer, tree_cpu_s  # noqa: E402
from _retrieval_refs import asearcher_app, encoder_ceiling, search_r1_app  # noqa: E402

SERVERS: dict[str, dict] = {
    "ours": {},
    "search-r1": {},
    "asearcher": {},
    "ours-nobatch": {"max_batch": 1},
    "ours-thread": {"worker": "thread"},
}
PHASES = ("c1", "c64", "batch64")


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def serve(name: str, index_dir: str, addr_file: str, max_wait_ms: float, dtype: str) -> None:
    from serving.servers.retrieval_server import ServerThread, create_app

    if name == "search-r1":
        app = search_r1_app(index_dir, cores(), dtype)
    elif name == "asearcher":
        app = asearcher_app(index_dir, cores(), dtype)
    else:
        opts = {"max_batch": 64, "max_wait_ms": max_wait_ms, "encoder_dtype": dtype, **SERVERS[name]}
        if opts.get("worker") == "thread":
            opts["threads"] = cores()  # one encoder in this process: give it every core
        app = create_app(index_dir, **opts)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # shut down cleanly (stops our worker processes)
    with ServerThread(app) as srv:
        tmp = Path(f"{addr_file}.tmp")
        tmp.write_text(srv.url)
        tmp.replace(addr_file)  # atomic: the parent never reads a half-written address
        while True:
            time.sleep(3600)


def measure(url: str, pid: int, requests: list[list[tuple[int, str]]], clients: int, topk: int) -> dict:
    import httpx

    from tools.base import percentiles

    before = httpx.get(url + "/stats").json()
    server0, client0 = tree_cpu_s(pid), time.process_time()
    wall, lat, results = asyncio.run(hammer(url, requests, clients, topk))
    client_cpu, server_cpu = time.process_time() - client0, tree_cpu_s(pid) - server0
    after = httpx.get(url + "/stats").json()
    p50, p99 = percentiles(lat, (0.5, 0.99))
    queries = sum(len(r) for r in requests)
    batches = after["batching"]["batches"] - before["batching"]["batches"]
    return {"qps": queries / wall, "wall_s": wall, "requests": len(requests), "queries": queries,
            "p50_ms": 1000 * p50, "p99_ms": 1000 * p99,
            "client_cpu": client_cpu / wall, "client_cpu_ms_per_request": 1000 * client_cpu / len(requests),
            "server_cores": server_cpu / wall, "server_cpu_ms_per_query": 1000 * server_cpu / queries,
            "query_cache_hits": after["query_cache"]["hits"] - before["query_cache"]["hits"],
            "mean_batch_size": (after["batching"]["queries"] - before["batching"]["queries"]) / batches
            if batches else None, "results": results}


def run_server(name: str, args, index_dir: Path, work: dict[str, list[list[tuple[int, str]]]]) -> dict:
    addr = Path(args.out).with_suffix(f".{name}.addr")
    addr.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, __file__, "--serve", name, "--index", str(index_dir), "--addr-file",
                             str(addr), "--max-wait-ms", str(args.max_wait_ms), "--encoder-dtype", args.encoder_dtype],
                            env=dict(os.environ, HEXSEARCH_QUIET="1"))
    try:
        while not addr.exists():
            if proc.poll() is not None:
                raise SystemExit(f"{name} server exited with {proc.returncode}")
            time.sleep(0.1)
        url = addr.read_text().strip()
        asyncio.run(hammer(url, work["warm"], min(args.clients, len(work["warm"])), args.topk))
        clients = {"c1": 1, "c64": args.clients, "batch64": 1}
        return {phase: measure(url, proc.pid, work[phase], clients[phase], args.topk) for phase in PHASES}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        addr.unlink(missing_ok=True)


TIE_TOLERANCE = {"float32": 1e-5, "bfloat16": 5e-3}
"""Scores this close are a tie at that precision: in bf16 a query's scores move by up to ~2e-3 with the
shape of the batch it was encoded in (padding width, rows), so two servers may order near-equal documents
differently."""


def compare(ours: dict[int, list], other: dict[int, list], dtype: str = "float32") -> dict[str, int]:
    tolerance = TIE_TOLERANCE[dtype]
    identical = ties = mismatched = 0
    for i, row in ours.items():
        a = [x["document"]["id"] for x in row]
        b = [x["document"]["id"] for x in other[i]]
        if a == b:
            identical += 1
            continue
        sa = [x["score"] for x in row]
        sb = [x["score"] for x in other[i]]
        # a tie: wherever the lists differ, both put a document with the same score (within the tolerance) there
        tie = len(a) == len(b) and all(abs(sa[j] - sb[j]) < tolerance for j in range(len(a)) if a[j] != b[j])
        ties, mismatched = (ties + 1, mismatched) if tie else (ties, mismatched + 1)
    return {"identical": identical, "tie_swaps": ties, "mismatched": mismatched, "checked": len(ours)}


def workload(entities: int) -> tuple[Path, list[str]]:
    """The index over a generated world and every distinct query we can ask of it."""
    from tools.index import default_index
    from world import default_world

    world = default_world(entities=entities, seed=0)
    index_dir = default_index(world)
    qs: list[str] = []
    for split in ("train", "dev", "test"):
        for line in open(world / f"qa_{split}.jsonl", encoding="utf-8"):
            qs.append(json.loads(line)["question"])
    titles = [json.loads(line)["title"] for line in open(world / "corpus.jsonl", encoding="utf-8")]
    for t in dict.fromkeys(titles):
        qs += [f"What is known about {t}?", f"history of {t}", f"{t} facts"]
    return index_dir, list(dict.fromkeys(qs))


def split_work(qs: list[str], args) -> dict[str, list[list[tuple[int, str]]]]:
    """Distinct queries for each phase, cut into requests: single queries, or `--batch-size` per request."""
    sizes = {"c64": args.requests, "c1": args.c1_requests, "batch64": args.batch_requests * args.batch_size,
             "warm": args.warmup}
    if sum(sizes.values()) > len(qs):
        raise SystemExit(f"only {len(qs)} distinct queries for {sum(sizes.values())}; use more --entities")
    work, start = {}, 0
    for phase, n in sizes.items():
        ids = list(range(start, start + n))
        per = args.batch_size if phase == "batch64" else 1
        work[phase] = [[(i, qs[i]) for i in ids[j:j + per]] for j in range(0, n, per)]
        start += n
    return work


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds, alternating the servers' order")
    ap.add_argument("--servers", default=",".join(SERVERS), help="comma-separated, from: " + ", ".join(SERVERS))
    ap.add_argument("--requests", type=int, default=1024, help="single-query requests at c=64")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--c1-requests", type=int, default=256, help="single-query requests at c=1")
    ap.add_argument("--batch-requests", type=int, default=8, help="requests of --batch-size queries, one at a time")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--topk", type=int, default=3)
    ap.add_argument("--entities", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=64)
    ap.add_argument("--max-wait-ms", type=float, default=2.0)
    ap.add_argument("--encoder-dtype", default="float32", choices=["float32", "bfloat16"],
                    help="every server's encoder precision (bfloat16: the record is retrieval_service_bf16)")
    ap.add_argument("--out", default="", help="JSON record (default: benchmarks/results/<name>.json)")
    ap.add_argument("--serve", choices=list(SERVERS), help=argparse.SUPPRESS)
    ap.add_argument("--index", help=argparse.SUPPRESS)
    ap.add_argument("--addr-file", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, args.index, args.addr_file, args.max_wait_ms, args.encoder_dtype)
        return
    name = "retrieval_service" + ("" if args.encoder_dtype == "float32" else "_bf16")
    args.out = args.out or str(ROOT / "benchmarks" / "results" / f"{name}.json")
    names = [s for s in args.servers.split(",") if s]
    if unknown := set(names) - set(SERVERS):
        raise SystemExit(f"unknown servers {sorted(unknown)}")
    if "ours" not in names:
        raise SystemExit("--servers must include ours (everything is compared with it)")

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    index_dir, qs = workload(args.entities)
    work = split_work(qs, args)
    print(f"index {index_dir}; servers {', '.join(names)}; {args.rounds} round(s); c=1: {args.c1_requests} "
          f"requests, c={args.clients}: {args.requests}, batch: {args.batch_requests} x {args.batch_size} queries; "
          f"top-{args.topk}; {cores()} cores", file=sys.stderr)
    t_start = time.perf_counter()
    runs: dict[str, list[dict]] = {n: [] for n in names}
    ceilings: list[float] = []
    c64_queries = [q for req in work["c64"] for _, q in req]
    for r in range(args.rounds):  # alternate the order so drifting background load favours no server
        ceilings.append(encoder_ceiling(str(index_dir), c64_queries, cores(), args.encoder_dtype))
        print(f"round {r} ceiling      c64 {ceilings[-1]:6.1f} q/s (encoder + FAISS alone, {cores()} processes, "
              f"batches of 64, no HTTP)", file=sys.stderr, flush=True)
        for server in (names if r % 2 == 0 else names[::-1]):
            res = run_server(server, args, index_dir, work)
            runs[server].append(res)
            print(f"round {r} {server:12s} " + "  ".join(
                f"{p} {res[p]['qps']:6.1f} q/s (p50 {res[p]['p50_ms']:.0f} ms, batch "
                f"{res[p]['mean_batch_size'] or 0:.1f}, client {100 * res[p]['client_cpu']:.0f}%, server "
                f"{res[p]['server_cores']:.2f} cores)" for p in PHASES) + f"  load {os.getloadavg()[0]:.1f}",
                file=sys.stderr, flush=True)

    def per_round(a: str, b: str, phase: str) -> dict:  # QPS ratio a/b, taken per round
        return spread([x[phase]["qps"] / y[phase]["qps"] for x, y in zip(runs[a], runs[b], strict=True)])

    def qps(name: str, phase: str) -> dict:
        return spread([x[phase]["qps"] for x in runs[name]])

    checks: dict[str, dict[str, int]] = {}
    for other in [n for n in names if n != "ours"]:
        total = {"identical": 0, "tie_swaps": 0, "mismatched": 0, "checked": 0}
        for mine, theirs in zip(runs["ours"], runs[other], strict=True):
            for phase in PHASES:
                for key, value in compare(mine[phase]["results"], theirs[phase]["results"], args.encoder_dtype).items():
                    total[key] += value
        checks[other] = total
        if total["mismatched"]:
            print(f"WARNING: {other}: {total['mismatched']} queries got different top-{args.topk} ids than ours",
                  file=sys.stderr)
    headline: dict = {f"{n}_{p}_qps": qps(n, p) for n in names for p in PHASES}
    headline["client_cpu_c64"] = spread([x["c64"]["client_cpu"] for n in names for x in runs[n]])
    headline["cache_hits"] = sum(x[p]["query_cache_hits"] for n in names for x in runs[n] for p in PHASES)
    headline["ceiling_c64_qps"] = spread(ceilings)
    headline["of_ceiling"] = spread([x["c64"]["qps"] / c for x, c in zip(runs["ours"], ceilings, strict=True)])
    parts = []
    if "search-r1" in names:
        headline["ceiling_ratio"] = spread([c / x["c64"]["qps"] for x, c in zip(runs["search-r1"], ceilings,
                                                                                 strict=True)])
        for key, phase in (("ratio", "c64"), ("c1_ratio", "c1"), ("batch64_ratio", "batch64")):
            headline[key] = per_round("ours", "search-r1", phase)
        parts += [kv('ratio', headline['ratio']), kv('c1_ratio', headline['c1_ratio']),
                  kv('batch64_ratio', headline['batch64_ratio'])]
    if "asearcher" in names:
        headline["vs_asearcher"] = per_round("ours", "asearcher", "c64")
        parts.append(kv('vs_asearcher', headline['vs_asearcher']))
    for key, other in (("batching_gain", "ours-nobatch"), ("process_gain", "ours-thread")):
        if other in names:
            headline[key] = per_round("ours", other, "c64")
            parts.append(kv(key, headline[key]))
    for n in names:
        parts.append(f"{n}_qps=c1:{qps(n, 'c1')['median']:.1f},c64:{qps(n, 'c64')['median']:.1f},"
                     f"b64:{qps(n, 'batch64')['median']:.1f}")
    ref = "search-r1" if "search-r1" in names else next((n for n in names if n != "ours"), None)
    if ref:
        c = checks[ref]
        parts.append(f"identical_topk={c['identical']}/{c['checked']} ties={c['tie_swaps']}")
    parts.append(kv("of_ceiling", headline["of_ceiling"]))
    if "ceiling_ratio" in headline:
        parts.append(kv("ceiling_ratio", headline["ceiling_ratio"]))
    parts += [f"ceiling_qps={headline['ceiling_c64_qps']['median']:.1f}", f"encoder_dtype={args.encoder_dtype}",
              kv('client_cpu', headline['client_cpu_c64']), f"cache_hits={headline['cache_hits']}",
              f"rounds={args.rounds}"]
    line = f"RESULT {name} " + " ".join(parts)
    details = {"servers": names, "rounds": args.rounds, "clients": args.clients, "topk": args.topk,
               "requests": {p: len(work[p]) for p in PHASES}, "batch_size": args.batch_size,
               "entities": args.entities, "index": str(index_dir), "threads_in_all": cores(),
               "max_wait_ms": args.max_wait_ms, "encoder_dtype": args.encoder_dtype, "ceilings_c64_qps": ceilings,
               "topk_check": checks, "wall_s": time.perf_counter() - t_start,
               "load_avg_end": os.getloadavg(),
               "runs": {n: [{p: {k: v for k, v in x[p].items() if k != "results"} for p in PHASES} for x in runs[n]]
                        for n in names},
               "note": "2-core machine shared with other jobs: figures are noisy"}
    write_result(name, line, headline, details, args.out)
    print(line)


if __name__ == "__main__":
    main()
