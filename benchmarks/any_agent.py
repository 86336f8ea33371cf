"""Overhead of the recording OpenAI endpoint (agent/openai_endpoint.py) against calling the engine directly.

    python benchmarks/any_agent.py [--episodes 64 --turns 3 --new-tokens 16 --rounds 3]
        [--model smollm2-135m-instruct | tiny-random] [--no-record]

Two arms on one embedded engine (serving.engines.embedded.EmbeddedEngine, in this process), run one after the
other, twice each (after a warm-up endpoint run that records the prompts; alternating order; the figure is the median):

    endpoint  --episodes concurrent episodes of `train.workflow=openai_agent`: a chat program (plain httpx; one
              client shared by all episodes, since making a client costs ~30 ms of SSL setup that is the
              program's, not the endpoint's) makes --turns chat calls, each
              appending the reply and a short tool result to its messages; the endpoint renders, records
              and serves every call through generate_continuing.
    direct    the same episodes replayed straight on the engine: each call's exact prompt ids (recorded
              in the endpoint arm) through generate_continuing, in the same order, no HTTP, no rendering.

Every call samples exactly --new-tokens tokens (`ignore_eos`), so both arms do the same engine work.

    overhead       = mean episode seconds, endpoint / direct          (target <= 1.1)
    call_overhead  = mean call seconds, endpoint / direct (the call as the program sees it)

The default model is the one the project trains (SmolLM2-135M); `--model tiny-random` (a model whose forward
costs almost nothing) shows the endpoint's own cost in isolation. Prints `RESULT any_agent overhead=<x> ...`
(the model's short name in the benchmark name for any other model, `any_agent_tiny-random`) and appends the
record to benchmarks/records.jsonl.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import RECORDS, spread, write_result  # noqa: E402

from agent.qa import QAItem  # noqa: E402
from agent.workflow import make_workflow  # noqa: E402
from hexsearch.config import HexConfig  # noqa: E402
from serving.protocol import GenerateRequest, SamplingParams, generate_continuing  # noqa: E402

ARGS: dict = {}
CALL_TIMES: list[float] = []
HTTP: dict = {}


async def chat_program(base_url: str, api_key: str, item: dict) -> str:
    """A minimal agent program: --turns chat calls, each reply and a tool result appended to the history."""
    import httpx

    messages = [{"role": "system", "content": "You answer questions with a search tool."},
                {"role": "user", "content": item["question"]}]
    loop = asyncio.get_running_loop()
    if HTTP.get("loop") is not loop:
        HTTP.update(loop=loop, client=httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=None)))
    http = HTTP["client"]
    for turn in range(ARGS["turns"]):
        t = time.perf_counter()
        r = await http.post(f"{base_url}/chat/completions", headers={"Authorization": f"Bearer {api_key}"},
                            json={"model": "any", "messages": messages, "max_tokens": ARGS["new_tokens"],
                                  "ignore_eos": True})
        CALL_TIMES.append(time.perf_counter() - t)
        r.raise_for_status()
        messages += [r.json()["choices"][0]["message"],
                     {"role": "user", "content": f"Tool result {turn}: Varnholt was founded in 1642."}]
    return "1642"


async def endpoint_arm(engine, items, recorded: dict) -> tuple[list[float], list[float]]:
    cfg = HexConfig()
    cfg.agent.program = f"{__name__}:chat_program"
    cfg.agent.max_turns = ARGS["turns"] + 1
    cfg.agent.max_new_tokens = ARGS["new_tokens"]
    workflow = make_workflow(cfg)
    CALL_TIMES.clear()

    async def one(k, item):
        t = time.perf_counter()
        traj = await workflow.arun_episode(engine, item, seed=k, request_id=f"ep{k}")
        assert traj.stop_reason == "answered", traj.meta.get("error")
        return time.perf_counter() - t
    await workflow.endpoint_for(engine)  # started before the clock, as in a worker
    original = engine.generate

    async def record(request, **kw):
        recorded.setdefault(request.request_id, []).append((list(request.prompt_ids), request.sampling))
        return await original(request, **kw)
    engine.generate = record
    try:
        episode_s = await asyncio.gather(*(one(k, it) for k, it in enumerate(items)))
    finally:
        engine.generate = original
        await workflow.aclose()
    return list(episode_s), list(CALL_TIMES)


async def direct_arm(engine, recorded: dict) -> tuple[list[float], list[float]]:
    calls: list[float] = []

    async def one(rid, steps):
        t0 = time.perf_counter()
        for prompt, sampling in steps:
            t = time.perf_counter()
            await generate_continuing(engine, GenerateRequest(prompt, SamplingParams(**vars(sampling)), rid + "-d"))
            calls.append(time.perf_counter() - t)
        return time.perf_counter() - t0
    episode_s = await asyncio.gather(*(one(rid, steps) for rid, steps in recorded.items()))
    return list(episode_s), calls


async def main() -> None:
    from serving.engines.embedded import EmbeddedEngine

    engine = EmbeddedEngine(ARGS["model"], dtype="float32", device="cpu", max_batch_size=ARGS["episodes"])
    items = [QAItem(f"q{k}", f"Question {k}: in what year was Varnholt founded?", ["1642"])
             for k in range(ARGS["episodes"])]
    recorded: dict = {}
    await endpoint_arm(engine, items, recorded)  # warm-up; records every call's prompt for the direct arm
    ratios, call_ratios, rows = [], [], []
    for rnd in range(ARGS["rounds"]):
        if rnd % 2 == 0:  # alternate which arm runs first
            ep_e, call_e = await endpoint_arm(engine, items, {})
            ep_d, call_d = await direct_arm(engine, recorded)
        else:
            ep_d, call_d = await direct_arm(engine, recorded)
            ep_e, call_e = await endpoint_arm(engine, items, {})
        ratios.append(statistics.mean(ep_e) / statistics.mean(ep_d))
        call_ratios.append(statistics.mean(call_e) / statistics.mean(call_d))
        rows.append({"episode_s": [statistics.mean(ep_e), statistics.mean(ep_d)],
                     "call_s": [statistics.mean(call_e), statistics.mean(call_d)]})
        print(f"round {rnd}: episode {rows[-1]['episode_s'][0]:.3f}s vs {rows[-1]['episode_s'][1]:.3f}s direct, "
              f"call {rows[-1]['call_s'][0] * 1e3:.1f}ms vs {rows[-1]['call_s'][1] * 1e3:.1f}ms", flush=True)
    name = "any_agent" if ARGS["model"] == "smollm2-135m-instruct" else f"any_agent_{ARGS['model']}"
    over, call = spread(ratios), spread(call_ratios)
    line = (f"RESULT {name} overhead={over['median']:.3f} overhead_range={over['min']:.3f}-{over['max']:.3f} "
            f"call_overhead={call['median']:.3f} episodes={ARGS['episodes']} turns={ARGS['turns']} "
            f"new_tokens={ARGS['new_tokens']} rounds={ARGS['rounds']} model={ARGS['model']}")
    write_result(name, line, {"overhead": over, "call_overhead": call}, {"rounds": rows, "args": dict(ARGS)},
                 records=None if ARGS["no_record"] else RECORDS)
    print(line)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--no-record", action="store_true", help="do not append to benchmarks/records.jsonl")
    ARGS.update(vars(p.parse_args()))
    asyncio.run(main())
