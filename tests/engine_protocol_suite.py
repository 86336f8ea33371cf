"""Reusable checks of the InferenceEngine protocol, run against every engine with the same assertions.

Each check is an `async def check_...(engine, ...)` taking anything that implements
`serving.protocol.InferenceEngine` (the embedded engine in-process, our HTTP server through a client,
vLLM-CPU through the remote client). Weight-update checks also take two weight sources the engine
accepts (a state dict or a checkpoint folder): `changed` (different weights) and `original` (the ones
it serves now), so they can restore what they change.

`exact` requests are deterministic: by default greedy; engines that honour per-request seeds may pass
`exact=dict(temperature=1.0, seed=...)` instead, which avoids the repetitive greedy output of random
test models.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from serving.protocol import Completion, GenerateRequest, SamplingParams, generate_continuing

TIMEOUT_S = 300.0
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Paris is the capital of",
         "In 1492, a ship sailed", "Question: who founded the city? Answer:", "1 2 3 4 5 6 7 8",
         "Search results:", "def f(x):\n    return", "Once upon a time"]


def perturbed_tiny(folder: Any, seed: int) -> Any:
    """`tiny-random` with every weight matrix shifted by seeded noise, saved to `folder` (the `changed`
    weights of the weight-update checks); returns the model."""
    import torch

    from serving.models import load_model

    model = load_model("tiny-random", dtype="float32")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim > 1:
                p.add_(0.5 * p.std() * torch.randn(p.shape, generator=g))
    model.save_pretrained(folder)
    return model


def prompts(engine: Any, n: int) -> list[list[int]]:
    """n distinct prompts of different lengths, tokenised with the engine's tokenizer."""
    tok = engine.tokenizer
    return [tok.encode(TEXTS[i % len(TEXTS)] + " " * (i // len(TEXTS)), add_special_tokens=False) for i in range(n)]


def _params(exact: dict | None, **kw) -> SamplingParams:
    return SamplingParams(**{"temperature": 0.0, **(exact or {}), **kw})


async def _gen(engine: Any, prompt: list[int], params: SamplingParams, request_id: str | None = None) -> Completion:
    req = GenerateRequest(list(prompt), params) if request_id is None else GenerateRequest(list(prompt), params,
                                                                                         request_id=request_id)
    return await asyncio.wait_for(engine.generate(req), TIMEOUT_S)


def assert_consistent(done: Completion, max_new: int, vocab: int | None = None,
                      versions: set[int] | None = None) -> None:
    """Ids, log-probs and versions line up; log-probs are finite and <= 0; the finish reason fits."""
    n = len(done.output_ids)
    assert n == len(done.logprobs) == len(done.versions), "one log-prob and one version per token"
    assert n <= max_new
    assert all(isinstance(t, int) for t in done.output_ids)
    if vocab is not None:
        assert all(0 <= t < vocab for t in done.output_ids)
    assert all(math.isfinite(x) and x <= 1e-4 for x in done.logprobs), done.logprobs
    assert done.finish_reason in ("stop", "length", "abort")
    if done.finish_reason == "length":
        assert n == max_new
    if versions is not None:
        assert set(done.versions) <= versions, (done.versions, versions)
    assert done.versions == sorted(done.versions), "versions never go back within one completion"


async def wait_for_progress(engine: Any, min_tokens: int = 8, timeout_s: float = 120.0, fallback_s: float = 2.0) -> None:
    """Wait until the engine reports `min_tokens` more generated tokens (or `fallback_s` without counters)."""
    start = (await engine.health()).get("tokens_generated")
    if start is None:
        await asyncio.sleep(fallback_s)
        return
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (await engine.health())["tokens_generated"] < start + min_tokens:
        assert asyncio.get_running_loop().time() < deadline, "engine made no progress"
        await asyncio.sleep(0.05)


async def check_generate_consistent(engine: Any, exact: dict | None = None, vocab: int | None = None) -> None:
    """A single request returns consistent ids, log-probs and versions, and honours max_new_tokens."""
    p = prompts(engine, 1)[0]
    done = await _gen(engine, p, _params(exact, max_new_tokens=12, ignore_eos=True))
    assert done.finish_reason == "length" and len(done.output_ids) == 12
    assert_consistent(done, 12, vocab, {engine.version})
    sampled = await _gen(engine, p, SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_new_tokens=9))
    assert_consistent(sampled, 9, vocab, {engine.version})
    assert len(sampled.output_ids) >= 1


async def check_stop_conditions(engine: Any, exact: dict | None = None) -> None:
    """A stop string ends generation on the token that completes it (kept); so does a stop token id."""
    p = prompts(engine, 2)[1]
    base = await _gen(engine, p, _params(exact, max_new_tokens=24, ignore_eos=True))
    ids, tok = base.output_ids, engine.tokenizer
    k = 6
    first = ids.index(ids[k])
    by_id = await _gen(engine, p, _params(exact, max_new_tokens=24, ignore_eos=True, stop_token_ids=[ids[k]]))
    assert by_id.output_ids == ids[: first + 1], "the stop token is the last output token"
    assert by_id.finish_reason == "stop" and by_id.stop_reason == ids[k]
    for j in range(1, len(ids)):  # a stop string first completed by token j
        piece = tok.decode(ids[j:j + 1]).strip()
        if len(piece) >= 2 and piece not in tok.decode(ids[:j]):
            break
    else:
        raise AssertionError(f"no usable stop string in {tok.decode(ids)!r}")
    by_str = await _gen(engine, p, _params(exact, max_new_tokens=24, ignore_eos=True, stop=[piece]))
    assert by_str.output_ids == ids[: j + 1], "the token completing the stop string is kept"
    assert by_str.finish_reason == "stop" and by_str.stop_reason == piece


async def check_pause_abort_returns_partial(engine: Any, max_new: int = 4000) -> None:
    """pause("abort") returns an in-flight request now with its partial tokens; requests sent while paused
    wait for resume()."""
    p = prompts(engine, 3)[2]
    long = asyncio.create_task(engine.generate(GenerateRequest(p, SamplingParams(max_new_tokens=max_new,
                                                                                 ignore_eos=True))))
    try:
        await wait_for_progress(engine)
        await asyncio.wait_for(engine.pause("abort"), TIMEOUT_S)
        done = await asyncio.wait_for(long, TIMEOUT_S)
        assert done.finish_reason == "abort" and 0 < len(done.output_ids) < max_new
        assert_consistent(done, max_new, versions={engine.version})
        late = asyncio.create_task(engine.generate(GenerateRequest(p, SamplingParams(max_new_tokens=4))))
        await asyncio.sleep(0.5)
        assert not late.done(), "a request sent while paused waits for resume()"
    finally:
        await asyncio.wait_for(engine.resume(), TIMEOUT_S)
    after = await asyncio.wait_for(late, TIMEOUT_S)
    assert after.finish_reason in ("stop", "length") and len(after.output_ids) >= 1


async def check_weight_update(engine: Any, changed: Any, original: Any, exact: dict | None = None) -> None:
    """update_weights changes log-probs and the version of new tokens; restoring gives the old log-probs back."""
    p = prompts(engine, 4)[3]
    params = _params(exact, max_new_tokens=6, ignore_eos=True)
    v0 = engine.version
    before = await _gen(engine, p, params)
    await asyncio.wait_for(engine.pause("abort"), TIMEOUT_S)
    await asyncio.wait_for(engine.update_weights(changed, v0 + 1), TIMEOUT_S)
    await asyncio.wait_for(engine.resume(), TIMEOUT_S)
    assert engine.version == v0 + 1
    after = await _gen(engine, p, params)
    assert after.versions == [v0 + 1] * len(after.output_ids)
    assert (after.output_ids[0] != before.output_ids[0]
            or abs(after.logprobs[0] - before.logprobs[0]) > 1e-3), "new weights must change log-probs"
    await asyncio.wait_for(engine.pause("wait"), TIMEOUT_S)
    await asyncio.wait_for(engine.update_weights(original, v0 + 2), TIMEOUT_S)
    await asyncio.wait_for(engine.resume(), TIMEOUT_S)
    again = await _gen(engine, p, params)
    assert again.output_ids == before.output_ids and again.versions == [v0 + 2] * len(again.output_ids)
    assert max(abs(a - b) for a, b in zip(again.logprobs, before.logprobs, strict=True)) < 1e-2


async def check_continuation_across_update(engine: Any, changed: Any, original: Any, max_new: int = 400) -> Completion:
    """generate_continuing survives pause(abort) + update + resume: full length, each token keeps its version."""
    p = prompts(engine, 5)[4]
    v0 = engine.version
    req = GenerateRequest(p, SamplingParams(max_new_tokens=max_new, ignore_eos=True))
    task = asyncio.create_task(generate_continuing(engine, req))
    try:
        await wait_for_progress(engine)
        await asyncio.wait_for(engine.pause("abort"), TIMEOUT_S)
        await asyncio.wait_for(engine.update_weights(changed, v0 + 1), TIMEOUT_S)
    finally:
        await asyncio.wait_for(engine.resume(), TIMEOUT_S)
    try:
        done = await asyncio.wait_for(task, TIMEOUT_S)
        assert done.finish_reason == "length" and len(done.output_ids) == max_new
        assert_consistent(done, max_new, versions={v0, v0 + 1})
        before_pause = done.versions.count(v0)
        assert 0 < before_pause < max_new, \
            f"one answer spans both versions: {before_pause} of {max_new} tokens were sampled before the update"
        assert done.versions[0] == v0 and done.versions[-1] == v0 + 1
    finally:  # the original weights come back even when an assertion failed: later tests share the engine
        await asyncio.wait_for(engine.pause("wait"), TIMEOUT_S)
        await asyncio.wait_for(engine.update_weights(original, v0 + 2), TIMEOUT_S)
        await asyncio.wait_for(engine.resume(), TIMEOUT_S)
    return done


async def check_concurrent(engine: Any, n: int = 8, exact: dict | None = None, same_as_alone: bool = True) -> None:
    """n concurrent requests of different lengths all complete; with `same_as_alone`, each equals the
    same request run alone (batching changes nothing)."""
    ps = prompts(engine, n)
    params = [_params(exact, max_new_tokens=4 + 3 * i, ignore_eos=True) for i in range(n)]
    outs = await asyncio.gather(*(_gen(engine, p, q) for p, q in zip(ps, params, strict=True)))
    for out, q in zip(outs, params, strict=True):
        assert out.finish_reason == "length"
        assert_consistent(out, q.max_new_tokens, versions={engine.version})
    if same_as_alone:
        for i in (0, n - 1):
            alone = await _gen(engine, ps[i], params[i])
            assert alone.output_ids == outs[i].output_ids
            assert max(abs(a - b) for a, b in zip(alone.logprobs, outs[i].logprobs, strict=True)) < 1e-3
