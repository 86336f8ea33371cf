"""The retrieval service over loopback: Search-R1/ASearcher wire formats, cross-request batching, stats."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fixtures.uploads import oversized_upload
from fixtures.world import questions, world_index

from serving.servers.retrieval_server import ServerThread, create_app
from tools.batcher import RetrievalBatcher, bucket
from tools.retriever import Retriever


@pytest.fixture(scope="module")
def world():
    return world_index()


@pytest.fixture(scope="module")
def retriever(world):
    return Retriever(world[1])


@pytest.fixture(scope="module")
def service(world):
    """The service as `hexsearch serve retrieval` runs it: the index loaded by worker processes (two,
    the default on a 2-core machine, named here so the test means the same on any machine)."""
    with ServerThread(create_app(world[1], default_topk=3, max_batch=32, max_wait_ms=2.0, workers=2)) as srv:
        yield srv


@pytest.fixture(scope="module")
def qs(world):
    return [q["question"] for q in questions(world[0])][:80]


def post(srv, path, body):
    return httpx.post(srv.url + path, json=body, timeout=120)


def ids(rows):
    return [[d["id"] for d in row] for row in rows]


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5])
def test_retrieve_both_formats_any_number_of_queries(service, retriever, qs, n):
    """return_scores true AND false, for 0, 1, 2 (Search-R1's broken case), 3 and 5 queries."""
    expected = retriever.search(qs[:n], 4)
    with_scores = post(service, "/retrieve", {"queries": qs[:n], "topk": 4, "return_scores": True})
    without = post(service, "/retrieve", {"queries": qs[:n], "topk": 4, "return_scores": False})
    assert with_scores.status_code == without.status_code == 200
    a, b = with_scores.json()["result"], without.json()["result"]
    assert len(a) == len(b) == n
    assert [[x["document"] for x in row] for row in a] == b  # same documents, with and without scores
    assert ids(b) == [[h.doc["id"] for h in row] for row in expected]
    for row, exp in zip(a, expected, strict=True):
        assert [x["score"] for x in row] == pytest.approx([h.score for h in exp], abs=1e-4)
        assert set(row[0]["document"]) >= {"id", "title", "url", "contents"}


def test_defaults_match_search_r1(service, qs):
    body = post(service, "/retrieve", {"queries": qs[:2]}).json()
    assert len(body["result"][0]) == 3  # server --topk
    assert "id" in body["result"][0][0] and "document" not in body["result"][0][0]  # return_scores=false


def test_search_r1_client_rendering(service, qs):
    """What Search-R1's client does with a response (`_passages2string`) works unchanged."""
    result = post(service, "/retrieve", {"queries": [qs[0]], "topk": 3, "return_scores": True}).json()["result"]
    text = ""
    for idx, item in enumerate(result[0]):
        content = item["document"]["contents"]
        title, body = content.split("\n")[0], "\n".join(content.split("\n")[1:])
        text += f"Doc {idx + 1}(Title: {title}) {body}\n"
    assert text.count("Doc ") == 3 and '(Title: "' in text


def test_bad_requests_are_422(service):
    assert post(service, "/retrieve", {"queries": ["x"], "topk": 0}).status_code == 422
    assert post(service, "/retrieve", {"queries": "not a list"}).status_code == 422
    assert post(service, "/retrieve", {"topk": 3}).status_code == 422
    assert post(service, "/access", {"url": "x"}).status_code == 422


def test_access_in_asearcher_format(service, world):
    page_url = questions(world[0], hops=1)[0]["chain"][0]
    body = post(service, "/access", {"urls": [page_url, "https://hexwiki.test/wiki/No_Such_Page",
                                              page_url.replace("https://", "http://")]}).json()
    page, missing, variant = body["result"]
    assert page["url"] == page_url and page["contents"] and missing is None and variant == page
    assert post(service, "/access", {"urls": []}).json() == {"result": []}


def test_concurrent_clients_are_batched_and_correct(service, retriever, qs):
    before = httpx.get(service.url + "/stats").json()

    async def client(i: int, c: httpx.AsyncClient):
        k = 2 + i % 3
        r = await c.post(service.url + "/retrieve", json={"queries": [qs[i]], "topk": k, "return_scores": True})
        return i, k, r.json()["result"][0]

    async def burst():
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=64)) as c:
            return await asyncio.gather(*(client(i, c) for i in range(64)))

    results = asyncio.run(burst())
    expected = {k: retriever.search(qs[:64], k) for k in (2, 3, 4)}
    for i, k, row in results:
        assert [x["document"]["id"] for x in row] == [h.doc["id"] for h in expected[k][i]], qs[i]
    after = httpx.get(service.url + "/stats").json()
    new_batches = after["batching"]["batches"] - before["batching"]["batches"]
    assert after["batching"]["queries"] - before["batching"]["queries"] == 64
    assert new_batches < 64  # some requests shared a batch
    assert any(int(label.split("-")[0]) > 1 for label in after["batching"]["batch_size_histogram"])
    assert after["batching"]["peak_in_flight"] == 2  # both encoder processes had a batch at once
    looked_up = {k: after["query_cache"][k] - before["query_cache"][k] for k in ("hits", "misses")}
    assert looked_up["hits"] + looked_up["misses"] == 64  # counted once each, summed over both workers
    # batches that ran beside another got one core's thread each
    assert after["batches_by_threads"].get("1", 0) > before["batches_by_threads"].get("1", 0)


def test_a_lone_request_gets_every_core(service, qs):
    """With the other worker idle, a batch runs with one thread per core, not one core's share."""
    cores = len(os.sched_getaffinity(0))
    before = httpx.get(service.url + "/stats").json()["batches_by_threads"]
    for q in qs[64:67]:  # one at a time: nothing else is in flight
        assert post(service, "/retrieve", {"queries": [q]}).status_code == 200
    after = httpx.get(service.url + "/stats").json()["batches_by_threads"]
    assert after.get(str(cores), 0) - before.get(str(cores), 0) == 3


def test_health_and_stats(service, retriever):
    health = httpx.get(service.url + "/health").json()
    assert health == {"status": "ok", "docs": retriever.size, "dim": 384, "index_type": "flat",
                      "encoder": "minilm", "encoder_dtype": "float32", "pages": True}
    post(service, "/retrieve", {"queries": ["repeat me"] * 2})
    for _ in range(4):  # each worker process has its own cache: one of them sees the query again
        post(service, "/retrieve", {"queries": ["repeat me"]})
    stats = httpx.get(service.url + "/stats").json()
    assert stats["retrieve"]["requests"] >= 2 and stats["retrieve"]["p99_ms"] >= stats["retrieve"]["p50_ms"] > 0
    assert stats["query_cache"]["hits"] >= 2  # the repeated query was encoded once
    assert set(stats["time_s"]) == {"encode_s", "search_s", "fetch_s"} and stats["worker"] == "ProcessRunner"


def test_a_killed_worker_is_replaced(service, qs):
    """A worker process dies. Idle, it is replaced at once and no request fails; in the middle of a batch,
    that request gets a retryable 503 that says so, and the next one is served."""
    from concurrent.futures import ThreadPoolExecutor

    assert post(service, "/retrieve", {"queries": qs[:1]}).status_code == 200
    runner = service.app.state.batcher.runner
    first = runner.pids()
    assert len(first) == 2
    os.kill(first[0], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while first[0] in runner.pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first[0] not in runner.pids() and len(runner.pids()) == 2 and runner.replaced == 1
    for q in qs[2:6]:  # the new worker (the first idle one) answers once loaded; nothing fails meanwhile
        assert post(service, "/retrieve", {"queries": [q]}).status_code == 200

    many = [f"{q} (variant {i})" for i in range(13) for q in qs][:1024]  # distinct: ~3 s of batches
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(post, service, "/retrieve", {"queries": many})
        time.sleep(0.5)  # both workers are in the middle of its batches
        os.kill(first[1], signal.SIGKILL)
        failed = pending.result()
    assert failed.status_code == 503 and "WorkerDied" in failed.json()["detail"], failed.text
    assert f"worker process {first[1]} exited" in failed.json()["detail"]
    again = post(service, "/retrieve", {"queries": qs[6:7], "topk": 2})
    assert again.status_code == 200 and len(again.json()["result"][0]) == 2, again.text
    assert first[1] not in runner.pids() and runner.replaced == 2
    assert httpx.get(service.url + "/stats").json()["workers_replaced"] == 2


def test_thread_worker_serves_the_same_results(retriever, service, qs):
    with ServerThread(create_app(retriever, default_topk=3)) as threaded:
        a = post(threaded, "/retrieve", {"queries": qs[:6], "return_scores": True}).json()
        stats = httpx.get(threaded.url + "/stats").json()
    b = post(service, "/retrieve", {"queries": qs[:6], "return_scores": True}).json()
    assert ids([[x["document"] for x in row] for row in a["result"]]) == \
        ids([[x["document"] for x in row] for row in b["result"]])
    assert stats["worker"] == "ThreadRunner"


async def test_batcher_in_process_groups_callers(retriever, qs):
    batcher = RetrievalBatcher(retriever, max_batch=16, max_wait_ms=50)
    results = await asyncio.gather(*(batcher.search([q], 3) for q in qs[:40]))
    assert [[h.rowid for h in r[0]] for r in results] == [[h.rowid for h in row] for row in retriever.search(qs[:40], 3)]
    stats = batcher.stats()
    assert stats["queries"] == 40 and stats["batches"] <= 5 and max(int(k.split("-")[0]) for k in stats["batch_size_histogram"]) >= 8
    await batcher.aclose()
    assert [bucket(n) for n in (1, 2, 3, 4, 7, 8, 64)] == ["1", "2-3", "2-3", "4-7", "4-7", "8-15", "64-127"]


async def test_batcher_holds_a_batch_open_only_when_company_is_likely(retriever, qs):
    """A lone caller is sent at once (it never waits out the batching window, here a minute); callers that
    arrive together still share one batch."""
    batcher = RetrievalBatcher(retriever, max_batch=16, max_wait_ms=60_000)
    try:
        for q in qs[:3]:  # one after another, like a single agent
            hits = await asyncio.wait_for(batcher.search([q], 3), timeout=30)
            assert [h.rowid for h in hits[0]] == [h.rowid for h in retriever.search([q], 3)[0]]
        assert batcher.stats()["batches"] == 3
        together = await asyncio.wait_for(asyncio.gather(*(batcher.search([q], 3) for q in qs[3:11])), timeout=30)
        assert len(together) == 8 and batcher.stats()["batches"] == 4, batcher.stats()
    finally:
        await batcher.aclose()


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def test_cli_serve_retrieval(world, tmp_path, qs):
    addr = tmp_path / "addr.txt"
    proc = subprocess.Popen([sys.executable, "-m", "hexsearch.cli", "-q", "serve", "retrieval", "--index", str(world[1]),
                             "--port", "0", "--addr-file", str(addr), "--topk", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 180
        while not addr.exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.time() < deadline, "service did not start"
            time.sleep(0.2)
        url = "http://" + addr.read_text().strip()
        body = httpx.post(url + "/retrieve", json={"queries": qs[:2]}, timeout=60).json()
        assert len(body["result"]) == 2 and len(body["result"][0]) == 2
        assert httpx.get(url + "/health", timeout=10).json()["status"] == "ok"
        workers = children(proc.pid)
        assert workers  # the encoder runs in a worker process
        proc.kill()  # even a SIGKILLed service must not leave its worker behind
        proc.wait(timeout=30)
        deadline = time.time() + 30
        while any(alive(pid) for pid in workers) and time.time() < deadline:
            time.sleep(0.2)
        assert not any(alive(pid) for pid in workers)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    bad = subprocess.run([sys.executable, "-m", "hexsearch.cli", "serve", "retrieval", "--index", str(tmp_path)],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "not an index folder" in bad.stderr


def test_oversized_requests_are_refused_quickly_while_small_ones_are_served(service):
    from serving.servers.retrieval_server import MAX_BODY_BYTES, MAX_QUERIES, MAX_QUERY_CHARS, MAX_RESULTS

    too_many = post(service, "/retrieve", {"queries": ["q"] * (MAX_QUERIES + 1)})
    assert too_many.status_code == 422 and f"at most {MAX_QUERIES}" in too_many.text
    too_long = post(service, "/retrieve", {"queries": ["x" * (MAX_QUERY_CHARS + 1)]})
    assert too_long.status_code == 422 and "characters" in too_long.text
    too_wide = post(service, "/retrieve", {"queries": ["q"] * 200, "topk": MAX_RESULTS // 100})
    assert too_wide.status_code == 422 and "results" in too_wide.text
    assert post(service, "/access", {"urls": ["u"] * (MAX_QUERIES + 1)}).status_code == 422

    async def race() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        huge = b'{"queries": ["' + b"x" * (MAX_BODY_BYTES + 10) + b'"]}'

        async def chunks():  # no Content-Length: the limit must hold while the body streams in
            for i in range(0, len(huge), 1 << 16):
                yield huge[i:i + (1 << 16)]

        async with httpx.AsyncClient(timeout=60) as c:
            headers = {"content-type": "application/json"}
            big = asyncio.ensure_future(c.post(service.url + "/retrieve", content=huge, headers=headers))
            streamed = asyncio.ensure_future(c.post(service.url + "/retrieve", content=chunks(), headers=headers))
            small = await c.post(service.url + "/retrieve", json={"queries": ["who founded the city"]})
            return await big, await streamed, small

    big, streamed, small = asyncio.run(race())
    assert big.status_code == 413 and "request body over" in big.text
    assert streamed.status_code == 413
    assert small.status_code == 200 and len(small.json()["result"][0]) == 3


def test_a_20_mb_body_gets_a_413_the_client_can_read_while_others_are_served(service, qs):
    """The 8 MB limit answered a 20 MB body with a connection reset (the client saw `Broken pipe`, never the 413):
    the rest of the body is drained first, and other requests are answered meanwhile."""
    answered = []
    reply = oversized_upload(service.port, "/retrieve", 20 << 20, lambda: answered.append(
        post(service, "/retrieve", {"queries": qs[:1], "topk": 2}).status_code))
    assert reply.startswith(b"HTTP/1.1 413") and b"request body over" in reply, reply[:300]
    assert answered == [200]


def test_accepted_connections_have_tcp_nodelay(service, qs):
    """Answers are sent at once, not held for the client's delayed ACK: every connection the server accepted
    has TCP_NODELAY (asyncio sets it only on sockets made with the TCP protocol number)."""
    import socket

    with httpx.Client(timeout=60, trust_env=False) as client:  # one kept-alive connection, several requests
        for q in qs[:3]:
            assert client.post(service.url + "/retrieve", json={"queries": [q], "topk": 2}).status_code == 200
        conns = list(service.server.server_state.connections)
        assert conns
        for conn in conns:
            sock = conn.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_bf16_encoder_agrees_with_fp32_and_a_bad_dtype_is_refused(world, retriever, qs):
    """bfloat16 (the CPU's half precision) finds what fp32 finds; an unknown dtype names the valid ones."""
    half = Retriever(world[1], encoder_dtype="bfloat16")
    assert half.encoder.dtype == "bfloat16"
    a, b = retriever.encode_queries(qs[:40]), half.encode_queries(qs[:40])
    assert a.dtype == b.dtype == "float32" and (a * b).sum(1).min() > 0.99  # unit vectors, nearly parallel
    same_top1 = sum(x[0].rowid == y[0].rowid for x, y in zip(retriever.search(qs[:40], 3), half.search(qs[:40], 3), strict=True))
    assert same_top1 >= 38
    with pytest.raises(ValueError, match="float32, bfloat16 or auto"):
        create_app(world[1], encoder_dtype="float64")
