"""The remote client (`serving.remote.vllm.VLLMEngine`) against OUR engine server, a real subprocess.

The same client class drives vLLM (tests/test_vllm_cpu.py); here it runs the shared protocol suite
against `hexsearch serve engine` with `tiny-random`, plus what only a network client has to get
right: reading the server's version, sending the trajectory id for sticky KV reuse, the seed policy,
straggler aborts, and the error classes a pool relies on (unreachable vs. lost reply vs. bad request).
"""

from __future__ import annotations

import asyncio

import engine_protocol_suite as suite
import pytest
import torch

from serving.protocol import GenerateRequest, SamplingParams
from serving.remote.transport import EngineRequestError, EngineUnavailable, GenerationLost
from serving.remote.vllm import VLLMEngine

pytestmark = pytest.mark.timeout(600)
EXACT = {"temperature": 1.0, "seed": 1234}  # our server honours seeds: deterministic, non-degenerate


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from serving.models import resolve_model

    changed = tmp_path_factory.mktemp("ckpt") / "changed"
    suite.perturbed_tiny(changed, seed=3)
    return {"original": resolve_model("tiny-random"), "changed": changed}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from serving.launch.servers import start_engine_server

    srv = start_engine_server("tiny-random", dtype="float32", max_batch_size=16, max_model_len=2048,
                              extra_args=["--threads", "1"], run_dir=tmp_path_factory.mktemp("run"),
                              startup_timeout_s=300)
    with pytest.MonkeyPatch.context() as mp:  # every client of this module sends the server's fresh token
        mp.setenv("HEXSEARCH_ENGINE_TOKEN", srv.token)
        yield srv
    srv.stop()


@pytest.fixture
def engine(server):
    return VLLMEngine(server.url, "tiny-random", backend="http", request_timeout_s=120)


def test_payload_seed_policy_and_sticky_id():
    """vLLM-CPU crashes on per-request seeds under chunked prefill, so the vllm dialect never sends one."""
    req = GenerateRequest([1, 2, 3], SamplingParams(max_new_tokens=4, seed=7, stop=["x"], ignore_eos=True),
                          request_id="traj-1")
    _, ours = VLLMEngine("http://127.0.0.1:1", "tiny-random", backend="http")._generate_payload(req, 4, "c")
    _, vllm = VLLMEngine("http://127.0.0.1:1", "tiny-random", backend="vllm")._generate_payload(req, 4, "c")
    assert ours["seed"] == 7 and "seed" not in vllm
    for payload in (ours, vllm):
        assert payload["prompt"] == [1, 2, 3] and payload["request_id"] == "traj-1"
        assert payload["return_token_ids"] and payload["logprobs"] == 0 and payload["ignore_eos"]
        assert payload["include_stop_str_in_output"] and payload["stop"] == ["x"]


async def test_protocol_suite(engine, checkpoints):
    await suite.check_generate_consistent(engine, exact=EXACT, vocab=len(engine.tokenizer))
    await suite.check_stop_conditions(engine, exact=EXACT)
    await suite.check_pause_abort_returns_partial(engine)
    await suite.check_weight_update(engine, str(checkpoints["changed"]), str(checkpoints["original"]), exact=EXACT)
    await suite.check_continuation_across_update(engine, str(checkpoints["changed"]), str(checkpoints["original"]),
                                                 max_new=200)
    await suite.check_concurrent(engine, n=8, exact=EXACT)


async def test_fresh_client_reads_the_server_version(engine, server, checkpoints):
    target = engine.version + 5
    await engine.update_weights(str(checkpoints["original"]), target)  # pauses and resumes by itself
    assert engine.version == target and not engine.paused
    other = VLLMEngine(server.url, "tiny-random", backend="http")
    assert other.version == target  # read before any call
    done = await asyncio.wait_for(other.generate(GenerateRequest([1, 2, 3], SamplingParams(max_new_tokens=3))), 60)
    assert done.versions == [target] * len(done.output_ids)  # server-side token_versions
    assert (await other.health())["version"] == target


async def test_straggler_queued_on_a_paused_server_is_aborted(engine):
    await engine._request("POST", "/pause", params={"mode": "abort"})  # the server pauses "under" the client
    try:
        call = asyncio.create_task(engine.generate(GenerateRequest([5, 6, 7], SamplingParams(max_new_tokens=8))))
        await asyncio.sleep(1.0)
        assert not call.done() and engine.in_flight == 1
        await asyncio.wait_for(engine.pause("abort"), 30)
        done = await asyncio.wait_for(call, 10)
        assert done.finish_reason == "abort" and done.output_ids == [] and engine.stats["stragglers"] == 0
    finally:
        await asyncio.wait_for(engine.resume(), 30)


async def test_lost_reply_unreachable_server_and_bad_request_are_told_apart(server):
    slow = VLLMEngine(server.url, "tiny-random", backend="http", request_timeout_s=1.0)
    await slow._request("POST", "/pause", params={"mode": "abort"})
    try:
        with pytest.raises(GenerationLost):  # sent, but no reply within the timeout
            await slow.generate(GenerateRequest([1, 2], SamplingParams(max_new_tokens=4)))
    finally:
        await slow._request("POST", "/resume")
    with pytest.raises(EngineRequestError) as bad:
        await slow.generate(GenerateRequest([10**7], SamplingParams(max_new_tokens=2)))
    assert bad.value.status == 400 and not bad.value.retryable
    from serving.launch.servers import free_port

    gone = VLLMEngine(f"http://127.0.0.1:{free_port()}", "tiny-random", backend="http", connect_timeout_s=2)
    with pytest.raises(EngineUnavailable):
        await gone.generate(GenerateRequest([1, 2], SamplingParams(max_new_tokens=2)))
    health = await gone.health()
    assert health["ok"] is False and "not reachable" in health["error"]
    with pytest.raises(TypeError, match="checkpoint folder"):
        await slow.update_weights({"w": torch.zeros(1)}, 1)


async def test_context_budget_is_clipped_to_max_model_len(engine):
    tok_budget = 2048 - 2040
    done = await asyncio.wait_for(engine.generate(GenerateRequest(
        [17] * 2040, SamplingParams(max_new_tokens=100, ignore_eos=True))), 120)
    assert done.finish_reason == "length" and len(done.output_ids) == tok_budget
    full = await engine.generate(GenerateRequest([17] * 2048, SamplingParams(max_new_tokens=5)))
    assert full.output_ids == [] and full.finish_reason == "length"  # no room left: nothing generated
