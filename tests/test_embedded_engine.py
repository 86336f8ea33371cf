"""The embedded engine in-process: the protocol suite, plus what only this engine promises.

Most tests use `tiny-random` in fp32 with a tiny prefill chunk (so prompts are prefilled in several
chunks and new requests join mid-flight); one uses the real SmolLM2-135M in fp32. "Teacher-forced"
means one plain forward pass of the same weights over prompt + output, the reference every behaviour
log-prob must match (max abs diff < 1e-3).
"""

from __future__ import annotations

import asyncio
import copy

import engine_protocol_suite as suite
import pytest
import torch

from serving.engines.embedded import EmbeddedEngine
from serving.engines.embedded_weights import WeightUpdateError
from serving.models import load_model, load_tokenizer
from serving.protocol import GenerateRequest, InferenceEngine, SamplingParams

EXACT = {"temperature": 1.0, "seed": 1234}  # deterministic and non-degenerate on a random model


def teacher_forced(model, prompt: list[int], output: list[int]) -> list[float]:
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt + output])).logits[0].float(), -1)
    return [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(output)]


def max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


def perturbed_state(model, seed: int, scale: float = 0.5) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=g) * v.std() if v.is_floating_point() and v.ndim > 1 else v
            for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-random", dtype="float32")


@pytest.fixture(scope="module")
def weights(tiny):
    return {"original": {k: v.clone() for k, v in tiny.state_dict().items()}, "changed": perturbed_state(tiny, 7)}


@pytest.fixture(scope="module")
def engine(tiny, tokenizer):
    eng = EmbeddedEngine(copy.deepcopy(tiny), tokenizer, dtype="float32", max_batch_size=8, prefill_chunk_tokens=16)
    yield eng
    eng.close()


def test_implements_the_protocol(engine):
    assert isinstance(engine, InferenceEngine)


@pytest.mark.parametrize("check", ["check_generate_consistent", "check_stop_conditions", "check_concurrent"])
async def test_protocol_suite(engine, check):
    await getattr(suite, check)(engine, exact=EXACT)


async def test_suite_pause_abort(engine):
    await suite.check_pause_abort_returns_partial(engine)


async def test_suite_weight_update(engine, weights):
    await suite.check_weight_update(engine, weights["changed"], weights["original"], exact=EXACT)


async def test_suite_continuation_across_update(engine, weights, tiny):
    done = await suite.check_continuation_across_update(engine, weights["changed"], weights["original"], max_new=120)
    p = suite.prompts(engine, 5)[4]
    changed = copy.deepcopy(tiny)
    changed.load_state_dict(weights["changed"])
    old = [i for i, v in enumerate(done.versions) if v == done.versions[0]]
    k = len(old)  # tokens before the switch were sampled by the original weights, the rest by the changed ones
    assert max_diff(teacher_forced(tiny, p, done.output_ids)[:k], done.logprobs[:k]) < 1e-3
    assert max_diff(teacher_forced(changed, p, done.output_ids)[k:], done.logprobs[k:]) < 1e-3


async def test_logprobs_equal_teacher_forcing_with_batching(engine, tiny):
    """Concurrent requests of different lengths, chunked prefill, requests joining mid-flight, rows finishing
    at different steps (and moving): every log-prob equals the teacher-forced forward pass."""
    ps = suite.prompts(engine, 6)
    ps[0] = ps[0] * 4  # a long prompt: several prefill chunks
    first = [asyncio.create_task(engine.generate(GenerateRequest(ps[i], SamplingParams(
        max_new_tokens=60 + 7 * i, ignore_eos=True, seed=i)))) for i in range(3)]
    await suite.wait_for_progress(engine, min_tokens=10)
    assert not any(t.done() for t in first), "later requests must join while the first ones decode"
    later = [asyncio.create_task(engine.generate(GenerateRequest(ps[i], SamplingParams(
        max_new_tokens=5 + 9 * i, ignore_eos=True, temperature=0.8, top_p=0.9)))) for i in range(3, 6)]
    outs = await asyncio.gather(*first, *later)
    for p, out in zip(ps, outs, strict=True):
        assert out.finish_reason == "length"
        assert max_diff(teacher_forced(tiny, p, out.output_ids), out.logprobs) < 1e-3


async def test_seeded_request_is_reproducible_whatever_else_runs(engine):
    p = suite.prompts(engine, 1)[0]
    params = SamplingParams(max_new_tokens=20, seed=99, ignore_eos=True)
    alone = await engine.generate(GenerateRequest(p, params))
    noise = [engine.generate(GenerateRequest(q, SamplingParams(max_new_tokens=30))) for q in suite.prompts(engine, 5)]
    together = await asyncio.gather(engine.generate(GenerateRequest(p, params)), *noise)
    assert together[0].output_ids == alone.output_ids
    other_seed = await engine.generate(GenerateRequest(p, SamplingParams(max_new_tokens=20, seed=100, ignore_eos=True)))
    assert other_seed.output_ids != alone.output_ids


async def test_sticky_request_id_reuses_the_kv_cache(engine, tiny):
    """Turn 2 of a trajectory extends turn 1's tokens: only the new suffix is prefilled, results unchanged."""
    tok = engine.tokenizer
    p1 = suite.prompts(engine, 3)[2]
    turn1 = await engine.generate(GenerateRequest(p1, SamplingParams(max_new_tokens=12, ignore_eos=True),
                                                  request_id="traj-1"))
    before = (await engine.health())["prefix_cache"]
    p2 = p1 + turn1.output_ids + tok.encode(" <information>tool text</information>", add_special_tokens=False)
    turn2 = await engine.generate(GenerateRequest(p2, SamplingParams(max_new_tokens=12, ignore_eos=True),
                                                  request_id="traj-1"))
    after = (await engine.health())["prefix_cache"]
    assert after["hits"] == before["hits"] + 1
    assert after["reused_tokens"] - before["reused_tokens"] == len(p1) + len(turn1.output_ids) - 1
    assert max_diff(teacher_forced(tiny, p2, turn2.output_ids), turn2.logprobs) < 1e-3
    other = await engine.generate(GenerateRequest(p2, SamplingParams(max_new_tokens=2), request_id="traj-2"))
    assert (await engine.health())["prefix_cache"]["hits"] == after["hits"] and other.output_ids


async def test_shared_system_prompt_is_prefilled_once(engine, tiny):
    """A new episode (new request id) copies the KV of the prefix it shares with an earlier one."""
    tok = engine.tokenizer
    system = tok.encode("You answer questions with a search engine. " * 4, add_special_tokens=False)
    q1, q2 = (tok.encode(q, add_special_tokens=False) for q in (" Who founded Rome?", " When was Paris built?"))
    await engine.generate(GenerateRequest(system + q1, SamplingParams(max_new_tokens=3), request_id="ep-a"))
    before = await engine.health()
    out = await engine.generate(GenerateRequest(system + q2, SamplingParams(max_new_tokens=5, ignore_eos=True),
                                                request_id="ep-b"))
    after = await engine.health()
    assert after["prefix_cache"]["shared_hits"] == before["prefix_cache"]["shared_hits"] + 1
    reused = after["prefix_cache"]["reused_tokens"] - before["prefix_cache"]["reused_tokens"]
    assert reused >= len(system) and after["prefill_tokens"] - before["prefill_tokens"] == len(system + q2) - reused
    assert max_diff(teacher_forced(tiny, system + q2, out.output_ids), out.logprobs) < 1e-3


async def test_a_wave_of_new_episodes_prefills_their_common_stem_once(engine, tiny):
    """Different questions behind one system prompt, admitted together (just after a weight update the
    cache is empty): the system prompt is prefilled once, copied to each, and every log-prob still
    equals the teacher-forced one."""
    tok = engine.tokenizer
    system = tok.encode("Search first, then answer briefly. " * 5, add_special_tokens=False)
    questions = [tok.encode(q, add_special_tokens=False) for q in (" Who founded Rome?", " When was Paris built?",
                                                                   " Where is Oslo?")]
    await engine.reset_prefix_cache()
    await engine.pause("wait")
    before = await engine.health()
    tasks = [asyncio.create_task(engine.generate(GenerateRequest(
        system + q, SamplingParams(max_new_tokens=4, ignore_eos=True, **EXACT), request_id=f"stem-{i}")))
        for i, q in enumerate(questions)]
    await asyncio.sleep(0.05)  # all three are queued before admission resumes
    await engine.resume()
    outs = await asyncio.gather(*tasks)
    after = await engine.health()
    assert after["stem_tokens_saved"] - before["stem_tokens_saved"] >= 2 * len(system)
    prefilled = after["prefill_tokens"] - before["prefill_tokens"]
    assert prefilled <= len(system) + sum(len(q) for q in questions) + 2  # the stem stops one token short
    for q, out in zip(questions, outs, strict=True):
        assert max_diff(teacher_forced(tiny, system + q, out.output_ids), out.logprobs) < 1e-3
    # the stem stays cached: a later episode of the same version copies it instead of prefilling it
    later = await engine.generate(GenerateRequest(system + questions[0][:-1], SamplingParams(max_new_tokens=2)))
    assert (await engine.health())["prefill_tokens"] - after["prefill_tokens"] < len(system) and later.output_ids


async def test_weight_update_invalidates_cached_prefixes(engine, weights):
    p = suite.prompts(engine, 2)[0]
    await engine.generate(GenerateRequest(p, SamplingParams(max_new_tokens=3), request_id="traj-x"))
    assert (await engine.health())["prefix_cache"]["entries"] >= 1
    await engine.pause("abort")
    await engine.update_weights(weights["original"], engine.version + 1)
    await engine.resume()
    assert (await engine.health())["prefix_cache"]["entries"] == 0


async def test_pause_wait_finishes_and_keep_freezes(engine):
    p = suite.prompts(engine, 1)[0]
    task = asyncio.create_task(engine.generate(GenerateRequest(p, SamplingParams(max_new_tokens=80, ignore_eos=True))))
    await suite.wait_for_progress(engine, min_tokens=3)
    await engine.pause("wait")
    assert task.done() and task.result().finish_reason == "length" and len(task.result().output_ids) == 80
    await engine.resume()

    task = asyncio.create_task(engine.generate(GenerateRequest(p, SamplingParams(max_new_tokens=300, ignore_eos=True))))
    await suite.wait_for_progress(engine, min_tokens=3)
    await engine.pause("keep")
    frozen = (await engine.health())["tokens_generated"]
    await asyncio.sleep(0.3)
    assert (await engine.health())["tokens_generated"] == frozen and not task.done()
    await engine.resume()
    done = await task
    assert done.finish_reason == "length" and len(done.output_ids) == 300


async def test_abort_one_request_by_id_and_cancellation(engine):
    p = suite.prompts(engine, 2)
    keep = asyncio.create_task(engine.generate(GenerateRequest(p[0], SamplingParams(max_new_tokens=60,
                                                                                    ignore_eos=True))))
    drop = asyncio.create_task(engine.generate(GenerateRequest(p[1], SamplingParams(max_new_tokens=4000,
                                                                                    ignore_eos=True),
                                                               request_id="drop-me")))
    await suite.wait_for_progress(engine, min_tokens=4)
    assert await engine.abort(["drop-me"]) == 1
    dropped = await drop
    assert dropped.finish_reason == "abort" and 0 < len(dropped.output_ids) < 4000
    assert (await keep).finish_reason == "length"
    gone = asyncio.create_task(engine.generate(GenerateRequest(p[1], SamplingParams(max_new_tokens=4000,
                                                                                    ignore_eos=True))))
    await suite.wait_for_progress(engine, min_tokens=4)
    gone.cancel()
    for _ in range(200):
        if (await engine.health())["running"] == 0:
            break
        await asyncio.sleep(0.05)
    assert (await engine.health())["running"] == 0, "a cancelled request leaves the batch"


async def test_eos_and_ignore_eos(engine):
    p = suite.prompts(engine, 1)[0]
    base = await engine.generate(GenerateRequest(p, SamplingParams(max_new_tokens=10, seed=5, ignore_eos=True)))
    eos = base.output_ids[4]
    saved = engine.eos_ids
    engine.eos_ids = frozenset({eos})
    try:
        stopped = await engine.generate(GenerateRequest(p, SamplingParams(max_new_tokens=10, seed=5)))
        ignored = await engine.generate(GenerateRequest(p, SamplingParams(max_new_tokens=10, seed=5, ignore_eos=True)))
    finally:
        engine.eos_ids = saved
    first = base.output_ids.index(eos)
    assert stopped.output_ids == base.output_ids[:first + 1] and stopped.finish_reason == "stop"
    assert stopped.stop_reason == eos and ignored.output_ids == base.output_ids


async def test_bad_requests_raise_clear_errors(engine):
    cases = [([], SamplingParams(), "empty"), ([10**7], SamplingParams(), "vocabulary"),
             ([1] * 5000, SamplingParams(), "max_model_len"), ([1, 2], SamplingParams(top_p=0.0), "top_p"),
             ([1, 2], SamplingParams(max_new_tokens=0), "max_new_tokens"),
             ([1, 2], SamplingParams(stop=[""]), "stop")]
    for prompt, params, words in cases:
        with pytest.raises(ValueError, match=words):
            await engine.generate(GenerateRequest(prompt, params))
    with pytest.raises(ValueError, match="unknown pause mode"):
        await engine.pause("sleep")
    ok = await engine.generate(GenerateRequest([1, 2, 3], SamplingParams(max_new_tokens=2)))
    assert len(ok.output_ids) >= 1, "the engine still works after refusing bad requests"


async def test_max_model_len_caps_the_output(tiny, tokenizer):
    eng = EmbeddedEngine(copy.deepcopy(tiny), tokenizer, dtype="float32", max_model_len=20)
    try:
        done = await eng.generate(GenerateRequest(list(range(100, 115)), SamplingParams(max_new_tokens=50,
                                                                                        ignore_eos=True)))
        assert done.finish_reason == "length" and len(done.output_ids) == 5
    finally:
        eng.close()


async def test_kv_budget_queues_requests_instead_of_failing(tiny, tokenizer):
    """A budget that fits about two rows: eight requests still all complete (they take turns)."""
    eng = EmbeddedEngine(copy.deepcopy(tiny), tokenizer, dtype="float32", kv_cache_gb=2 * 64 * 1024 / 2**30)
    try:
        outs = await asyncio.gather(*(eng.generate(GenerateRequest(p, SamplingParams(max_new_tokens=40,
                                                                                     ignore_eos=True)))
                                      for p in suite.prompts(eng, 8)))
        assert all(o.finish_reason == "length" and len(o.output_ids) == 40 for o in outs)
        for p, o in zip(suite.prompts(eng, 8), outs, strict=True):
            assert max_diff(teacher_forced(tiny, p, o.output_ids), o.logprobs) < 1e-3
    finally:
        eng.close()


async def test_update_from_folder_partial_dict_and_bad_source(tiny, tokenizer, tmp_path):
    eng = EmbeddedEngine(copy.deepcopy(tiny), tokenizer, dtype="float32")
    try:
        p = suite.prompts(eng, 1)[0]
        reference = copy.deepcopy(tiny)
        reference.load_state_dict(perturbed_state(tiny, 3))
        reference.save_pretrained(tmp_path / "ckpt")
        await eng.pause("abort")
        await eng.update_weights(str(tmp_path / "ckpt"), 1)
        await eng.resume()
        out = await eng.generate(GenerateRequest(p, SamplingParams(max_new_tokens=8, ignore_eos=True)))
        assert out.versions == [1] * 8
        assert max_diff(teacher_forced(reference, p, out.output_ids), out.logprobs) < 1e-3

        with torch.no_grad():
            reference.model.norm.weight.mul_(3.0)
        await eng.update_weights({"model.norm.weight": reference.model.norm.weight.clone()}, 2)
        out = await eng.generate(GenerateRequest(p, SamplingParams(max_new_tokens=8, ignore_eos=True)))
        assert max_diff(teacher_forced(reference, p, out.output_ids), out.logprobs) < 1e-3

        with pytest.raises(WeightUpdateError, match="match nothing"):
            await eng.update_weights({"model.no_such.weight": torch.zeros(3)}, 3)
        with pytest.raises(WeightUpdateError, match="shape"):
            await eng.update_weights({"model.norm.weight": torch.zeros(3)}, 3)
        with pytest.raises(WeightUpdateError, match="does not exist"):
            await eng.update_weights(str(tmp_path / "missing"), 3)
        assert eng.version == 2
        again = await eng.generate(GenerateRequest(p, SamplingParams(max_new_tokens=8, ignore_eos=True)))
        assert max_diff(teacher_forced(reference, p, again.output_ids), again.logprobs) < 1e-3
    finally:
        eng.close()


async def test_peft_lora_model_and_adapter_updates(tiny, tokenizer, tmp_path):
    """A peft model is served merged (the trainer's copy untouched); adapter-only updates are re-merged."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    policy = get_peft_model(copy.deepcopy(tiny), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    eng = EmbeddedEngine(policy, tokenizer, dtype="float32")
    try:
        assert any("lora_A" in k for k in policy.state_dict()), "the trainer's peft model is not merged in place"
        p = suite.prompts(eng, 2)[1]
        out = await eng.generate(GenerateRequest(p, SamplingParams(max_new_tokens=8, ignore_eos=True)))
        assert max_diff(teacher_forced(policy, p, out.output_ids), out.logprobs) < 1e-3

        with torch.no_grad():
            for name, param in policy.named_parameters():
                if "lora_" in name:
                    param.add_(torch.randn_like(param) * 0.5)
        await eng.update_weights(get_peft_model_state_dict(policy), 1)
        out = await eng.generate(GenerateRequest(p, SamplingParams(max_new_tokens=8, ignore_eos=True)))
        assert max_diff(teacher_forced(policy, p, out.output_ids), out.logprobs) < 1e-3

        with torch.no_grad():
            for name, param in policy.named_parameters():
                if "lora_B" in name:
                    param.mul_(-1.0)
        policy.save_pretrained(tmp_path / "adapter")
        await eng.update_weights(str(tmp_path / "adapter"), 2)
        out = await eng.generate(GenerateRequest(p, SamplingParams(max_new_tokens=8, ignore_eos=True)))
        assert max_diff(teacher_forced(policy, p, out.output_ids), out.logprobs) < 1e-3
    finally:
        eng.close()


async def test_smollm2_fp32_logprobs_equal_teacher_forcing_with_batching():
    """The real model: concurrent requests of different lengths, one joining mid-flight, chunked prefill."""
    model = load_model("smollm2-135m-instruct", dtype="float32")
    tok = load_tokenizer("smollm2-135m-instruct")
    eng = EmbeddedEngine(copy.deepcopy(model), tok, dtype="float32", prefill_chunk_tokens=24)
    try:
        chats = ["What is the capital of France?", "Name three fruits.", "Write a haiku about search engines."]
        ps = [tok.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True, tokenize=False)
              for c in chats]
        ps = [tok.encode(p, add_special_tokens=False) for p in ps]
        first = [asyncio.create_task(eng.generate(GenerateRequest(ps[i], SamplingParams(
            max_new_tokens=10 + 4 * i, seed=i, ignore_eos=True)))) for i in range(2)]
        await suite.wait_for_progress(eng, min_tokens=3)
        late = eng.generate(GenerateRequest(ps[2], SamplingParams(max_new_tokens=8, temperature=0.0)))
        outs = await asyncio.gather(*first, late)
        for p, out in zip(ps, outs, strict=True):
            assert max_diff(teacher_forced(model, p, out.output_ids), out.logprobs) < 1e-3
        assert tok.decode(outs[2].output_ids).strip(), "greedy output of the real model is text"
    finally:
        eng.close()


async def test_identical_prompts_share_one_prefill(engine, tiny):
    """A GRPO group (same prompt, different seeds) is prefilled once; every sample is still exact, and a
    cancelled leader does not strand its followers."""
    p = suite.prompts(engine, 4)[3] * 3
    before = await engine.health()
    group = [engine.generate(GenerateRequest(p, SamplingParams(max_new_tokens=12, seed=s, ignore_eos=True)))
             for s in range(4)]
    outs = await asyncio.gather(*group)
    assert len({tuple(o.output_ids) for o in outs}) > 1, "different seeds, different samples"
    for o in outs:
        assert max_diff(teacher_forced(tiny, p, o.output_ids), o.logprobs) < 1e-3
    after = await engine.health()
    assert after["tokens_generated"] - before["tokens_generated"] == 48
    reused = after["prefix_cache"]["reused_tokens"] - before["prefix_cache"]["reused_tokens"]
    assert after["prefill_tokens"] - before["prefill_tokens"] == len(p) - reused, "one prefill for the group"

    tasks = [asyncio.create_task(engine.generate(GenerateRequest(p, SamplingParams(max_new_tokens=6, seed=s))))
             for s in range(3)]
    await asyncio.sleep(0)
    tasks[0].cancel()
    rest = await asyncio.gather(*tasks[1:])
    assert all(len(o.output_ids) == 6 or o.finish_reason == "stop" for o in rest)
