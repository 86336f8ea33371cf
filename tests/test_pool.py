"""EnginePool over several REAL engine servers (`hexsearch serve engine` subprocesses with tiny-random).

Covers sticky routing, spreading by load, throughput weighting (the routing formula on measured
figures), killing a server mid-run (its calls are resubmitted, none is lost or duplicated), bringing
it back (the pool reloads the weights it missed), lost replies that must NOT be resubmitted, and
pause/resume/update fan-out.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from serving.engines.pool import EnginePool, NoLiveServer
from serving.factory import build_engine
from serving.launch.servers import free_port, start_engine_server
from serving.protocol import GenerateRequest, SamplingParams, generate_continuing
from serving.remote.transport import GenerationLost
from serving.remote.vllm import VLLMEngine

pytestmark = pytest.mark.timeout(600)


TOKEN = secrets.token_urlsafe(32)
"""One control token for all the servers of this module (a pool's clients send the one $HEXSEARCH_ENGINE_TOKEN)."""


@pytest.fixture(scope="module", autouse=True)
def _token_env():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HEXSEARCH_ENGINE_TOKEN", TOKEN)
        yield


def _start(port: int | None = None):
    # one torch thread each: three servers share two cores, and oversubscribed OpenMP crawls
    return start_engine_server("tiny-random", dtype="float32", max_batch_size=16, max_model_len=2048, port=port,
                               extra_args=["--threads", "1"], startup_timeout_s=300, token=TOKEN)


@pytest.fixture(scope="module")
def servers():
    with ThreadPoolExecutor(3) as pool:
        started = list(pool.map(lambda _: _start(), range(3)))
    yield started
    for s in started:
        s.stop()


@pytest.fixture(scope="module")
def changed_checkpoint(tmp_path_factory):
    from serving.models import load_model

    model = load_model("tiny-random", dtype="float32")
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim > 1:
                p.mul_(1.5)
    out = tmp_path_factory.mktemp("ckpt") / "changed"
    model.save_pretrained(out)
    return str(out)


def _pool(urls: list[str], **kw) -> EnginePool:
    engines = [VLLMEngine(u, "tiny-random", backend="http", request_timeout_s=kw.pop("timeout", 120)) for u in urls]
    return EnginePool(engines, health_interval_s=kw.pop("health_interval_s", 0.5), **kw)


def _req(rid: str, n: int = 24, prompt: list[int] | None = None) -> GenerateRequest:
    return GenerateRequest(prompt or [1, 2, 3, 4], SamplingParams(max_new_tokens=n, ignore_eos=True), request_id=rid)


def test_build_engine_makes_a_pool_for_several_urls(servers):
    from serving.config import EngineConfig

    pool = build_engine(EngineConfig(model="tiny-random", backend="http", urls=[s.url for s in servers[:2]]))
    single = build_engine(EngineConfig(model="tiny-random", backend="vllm", urls=[servers[0].url]))
    assert isinstance(pool, EnginePool) and len(pool.engines) == 2 and pool.tokenizer is pool.engines[1].tokenizer
    assert isinstance(single, VLLMEngine) and single.backend == "vllm" and not single.send_seed
    with pytest.raises(ValueError, match="engine.urls"):
        build_engine(EngineConfig(model="tiny-random", backend="sglang", urls=[]))


def test_routing_prefers_fast_and_idle_servers():
    """score = (in_flight + 1) / throughput: a server 10x faster takes ~10x the new calls."""
    pool = _pool(["http://127.0.0.1:1", "http://127.0.0.1:2"])
    fast, slow = (s.meter for s in pool._servers)
    for meter, rate in ((fast, 100.0), (slow, 10.0)):
        meter.busy, meter.tokens = 10.0, 10.0 * rate  # 10 busy seconds measured at `rate` tokens/s
    picks = []
    for k in range(22):
        i = pool._route(f"r{k}", set())
        pool._servers[i].meter.start()
        picks.append(i)
    assert picks.count(0) == 20 and picks.count(1) == 2
    pool._remember("r0", 1)  # sticky beats load
    assert pool._route("r0", set()) == 1 and pool._route("r0", {1}) == 0
    pool._mark_down(1, "test")
    assert "r0" not in pool._sticky and pool._route("r0", set()) == 0
    with pytest.raises(NoLiveServer):
        pool._route("x", {0})


async def test_sticky_ids_stay_and_new_ids_spread(servers):
    pool = _pool([s.url for s in servers])
    try:
        done = await asyncio.wait_for(asyncio.gather(*(pool.generate(_req(f"t{k}")) for k in range(24))), 300)
        assert all(len(d.output_ids) == 24 for d in done)
        assert all(e.stats["calls"] >= 4 for e in pool.engines), [e.stats for e in pool.engines]  # spread
        home = pool._sticky["t5"]
        before = [e.stats["calls"] for e in pool.engines]
        prompt = [1, 2, 3, 4]
        for _ in range(4):  # a multi-turn trajectory: each turn extends the last and goes to the same server
            turn = await asyncio.wait_for(pool.generate(_req("t5", 8, prompt)), 120)
            prompt = prompt + turn.output_ids + [7]
        after = [e.stats["calls"] for e in pool.engines]
        assert [a - b for a, b in zip(after, before, strict=True)] == [4 if i == home else 0 for i in range(3)]
    finally:
        await pool.aclose()


async def test_kill_one_mid_run_then_bring_it_back_with_the_missed_weights(servers, changed_checkpoint):
    victim = servers[1]
    pool = _pool([s.url for s in servers])
    try:
        for k in range(4):  # pin four long calls to the victim, so some are surely running when it dies
            pool._remember(f"k{k}", 1)
        calls = [asyncio.create_task(pool.generate(_req(f"k{k}", 1000 if k < 4 else 64))) for k in range(16)]
        deadline = time.monotonic() + 120
        while pool.engines[1].in_flight < 4:
            assert time.monotonic() < deadline, "the pinned calls never reached the victim"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        os.killpg(victim.pid, signal.SIGKILL)  # the whole server process group, mid-generation
        done = await asyncio.wait_for(asyncio.gather(*calls), 400)
        assert [len(d.output_ids) for d in done] == [1000] * 4 + [64] * 12
        assert all(d.finish_reason == "length" for d in done)
        assert pool.stats["resubmitted"] >= 4 and pool.stats["lost"] == 0 and pool.stats["calls"] == 16
        assert victim.url not in pool.live() and len(pool.live()) == 2

        v = pool.version + 1  # the pool moves on without the dead server
        await asyncio.wait_for(pool.update_weights(changed_checkpoint, v), 120)
        assert [e.version for e in pool.engines if e.url in pool.live()] == [v, v]

        port = int(victim.url.rsplit(":", 1)[1])
        servers[1] = _start(port)  # same address, fresh process at version 0 with the original weights
        deadline = time.monotonic() + 60
        while victim.url not in pool.live():
            assert time.monotonic() < deadline, "the restarted server never rejoined"
            await asyncio.sleep(0.2)
        assert pool.stats["rejoined"] == 1 and pool.engines[1].version == v
        info = await pool.engines[1]._request("GET", "/weight_info")
        assert info["weight_version"] == str(v)  # it really reloaded the checkpoint it missed
        pool._remember("back", 1)
        again = await asyncio.wait_for(pool.generate(_req("back", 4)), 60)
        assert again.versions == [v] * 4
    finally:
        await pool.aclose()


async def test_lost_reply_on_a_live_server_is_not_resubmitted(servers):
    pool = _pool([servers[0].url, servers[2].url], timeout=1.0)
    target = pool.engines[0]
    await target._request("POST", "/pause", params={"mode": "abort"})  # replies will time out
    try:
        pool._remember("lost", 0)
        with pytest.raises(GenerationLost):
            await pool.generate(_req("lost", 4))
        assert pool.stats == {"calls": 0, "resubmitted": 0, "lost": 1, "rejoined": 0}
        assert pool.engines[1].stats["calls"] == 0, "the other server must not get a duplicate"
    finally:
        await target._request("POST", "/resume")
        await pool.aclose()


async def test_unreachable_server_is_skipped_and_fan_out_reaches_all(servers):
    dead = f"http://127.0.0.1:{free_port()}"
    pool = _pool([dead, servers[0].url, servers[2].url])
    try:
        pool._remember("d", 0)  # pinned to the dead server: it must go elsewhere
        done = await asyncio.wait_for(pool.generate(_req("d", 6)), 60)
        assert len(done.output_ids) == 6 and pool.stats["resubmitted"] == 1 and dead not in pool.live()

        long = [asyncio.create_task(generate_continuing(pool, _req(f"p{k}", 800))) for k in range(4)]
        deadline = time.monotonic() + 60
        while sum(e.in_flight for e in pool.engines) < 4 or sum(e.stats["tokens"] for e in pool.engines) < 6:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        await asyncio.wait_for(pool.pause("abort"), 60)
        for e in pool.engines[1:]:
            assert (await e._request("GET", "/is_paused"))["is_paused"] is True
        await asyncio.sleep(0.3)
        assert not any(t.done() for t in long), "aborted calls are continued, and wait for resume"
        await asyncio.wait_for(pool.resume(), 60)
        finished = await asyncio.wait_for(asyncio.gather(*long), 300)
        assert all(len(f.output_ids) == 800 and f.finish_reason == "length" for f in finished)
        assert all(e.stats["aborted"] >= 1 for e in pool.engines[1:]), "the pause reached both live servers"
        health = await pool.health()
        assert health["ok"] and [s["up"] for s in health["servers"]] == [False, True, True]
    finally:
        await pool.aclose()
