"""The ScriptedEngine behaves like an InferenceEngine where clients depend on it."""

from __future__ import annotations

import asyncio

import pytest

from serving.engines.scripted import ScriptedEngine, ScriptedOutput, synthetic_logprob
from serving.protocol import GenerateRequest, InferenceEngine, SamplingParams, generate_continuing


def req(ids=(1, 2, 3), rid="r", **sp) -> GenerateRequest:
    return GenerateRequest(prompt_ids=list(ids), sampling=SamplingParams(**sp), request_id=rid)


async def test_protocol_stop_strings_eos_and_length(tokenizer):
    e = ScriptedEngine(["<search>q</search> trailing", "abc" * 20, [5, 6, tokenizer.eos_token_id, 7], "done"],
                       tokenizer=tokenizer)
    assert isinstance(e, InferenceEngine)
    c = await e.generate(req(stop=["</search>"]))
    assert c.finish_reason == "stop" and c.stop_reason == "</search>"
    assert tokenizer.decode(c.output_ids) == "<search>q</search>"  # the completing token is kept
    assert c.logprobs == [synthetic_logprob(t, i) for i, t in enumerate(c.output_ids)] and c.versions == [0] * len(c.output_ids)
    c = await e.generate(req(max_new_tokens=4))
    assert c.finish_reason == "length" and len(c.output_ids) == 4
    c = await e.generate(req())
    assert c.output_ids == [5, 6, tokenizer.eos_token_id] and c.stop_reason == tokenizer.eos_token_id
    c = await e.generate(req())
    assert c.finish_reason == "stop" and c.stop_reason is None  # the script ran out of tokens
    with pytest.raises(RuntimeError, match="script exhausted after 4 calls"):
        await e.generate(req())
    assert [len(call.prompt_ids) for call in e.calls] == [3, 3, 3, 3, 3]


async def test_responder_async_and_exceptions(tokenizer):
    seen = []

    async def respond(prompt_ids, request):
        seen.append((list(prompt_ids), request.request_id))
        return ScriptedOutput(ids=[10, 11], logprobs=[-0.5, -0.25]) if len(seen) == 1 else ValueError("boom")

    e = ScriptedEngine(responder=respond, tokenizer=tokenizer)
    c = await e.generate(req(rid="x"))
    assert c.output_ids == [10, 11] and c.logprobs == [-0.5, -0.25] and seen == [([1, 2, 3], "x")]
    with pytest.raises(ValueError, match="boom"):
        await e.generate(req())
    assert e.calls[-1].error == "ValueError: boom"


async def test_abort_continue_and_version_update(tokenizer):
    e = ScriptedEngine([ScriptedOutput(ids=list(range(100, 110)), hold_after=4)], tokenizer=tokenizer)
    task = asyncio.create_task(generate_continuing(e, req(rid="a")))
    await asyncio.wait_for(e.wait_held(), 5)
    await e.pause("abort")
    assert (await e.health())["paused"]
    await e.update_weights({"w": 0}, version=3)
    await e.resume()
    c = await asyncio.wait_for(task, 5)
    assert c.output_ids == list(range(100, 110)) and c.versions == [0] * 4 + [3] * 6
    assert e.version == 3 and e.weight_updates == [({"w": 0}, 3)]
    assert e.calls[1].prompt_ids == [1, 2, 3, 100, 101, 102, 103]


async def test_continuing_sends_the_callers_context_without_copying_it(tokenizer):
    """A long agent context is handed to the engine as it is: copying it on every call made the
    agent's cost per turn grow with the history (benchmarks/agent_long_horizon.py under `full`)."""
    seen = []
    e = ScriptedEngine(responder=lambda ids, request: seen.append(ids) or ScriptedOutput(ids=[7, 8]),
                       tokenizer=tokenizer, record=False)
    request = req(ids=range(5000))
    c = await generate_continuing(e, request)
    assert c.output_ids == [7, 8] and seen[0] is request.prompt_ids and request.prompt_ids == list(range(5000))


async def test_paused_calls_wait_for_resume_and_wait_mode(tokenizer):
    e = ScriptedEngine(["a b c", "d"], tokenizer=tokenizer, token_delay_s=0.001)
    running = asyncio.create_task(e.generate(req()))
    await asyncio.sleep(0)
    await e.pause("wait")  # returns when the in-flight call finished
    assert running.done() and running.result().finish_reason == "stop"
    blocked = asyncio.create_task(e.generate(req()))
    await asyncio.sleep(0.01)
    assert not blocked.done() and (await e.health())["waiting"] == 1
    await e.resume()
    assert tokenizer.decode((await asyncio.wait_for(blocked, 5)).output_ids) == "d"
