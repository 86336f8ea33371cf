"""Does the agent's cost per turn stay flat over a 500-turn episode?

One episode of 500 LLM calls on the ScriptedEngine (instant, nothing recorded) with instant local
tools (in-memory search and pages), so the time of a turn is the agent's own work: budget checks,
tokenising new text, parsing, building the prompt, context-policy rewrites, segment bookkeeping.
The scripted model searches, opens 3-chunk pages, reads every result in a read turn and answers at
turn 500.

    ratio = mean time of turns 451-500 / mean time of turns 1-50

Time is this process's CPU time (the machine is shared; CPU time does not count other programs'
turns on the cores); the wall-clock ratio is reported next to it. Before each episode the
existing heap is frozen out of the cyclic GC (`gc.freeze`): otherwise one full collection that scans
the imported libraries' objects lands in a random turn window and dominates it. Each policy runs
`--repeats` times.

Measured under each context policy, `read_once` (the default), `keep_last_k` and `full`, for ours and
for the baseline under the same policy, alternating, `--repeats` times; figures are medians with
their range. Under `read_once`/`keep_last_k` pages shrink to stubs after they are read and the
oldest turns are dropped when the context is full, so the prompt stays bounded. Under `full`
nothing is removed and the prompt grows about 20x over the episode; our harness's cost per turn
still stays flat (target ratio <= 1.1): only new text is tokenised, nothing re-renders the history,
and the context list goes to the engine as it is (no per-call copy; an engine's own prefill and
attention cost is the engine's, not the harness's, and the scripted engine here has none).

The baseline is the text-space agent peers use (AReaL re-renders the chat template over the whole
history each turn): the same episode with the whole context detokenised and re-tokenised before
every call. Its cost per turn grows with what the policy keeps. Peak memory is the largest Python
allocation during an episode (tracemalloc, in a separate untimed run), plus the process's peak RSS.

    python benchmarks/agent_long_horizon.py [--turns 500] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import resource
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import fmt, kv, spread, write_result  # noqa: E402

from agent.config import AgentConfig  # noqa: E402
from agent.events import AgentEvent  # noqa: E402
from agent.loop import Agent  # noqa: E402
from agent.qa import QAItem  # noqa: E402
from serving.engines.scripted import ScriptedEngine  # noqa: E402
from serving.models import load_tokenizer  # noqa: E402
from tools.memory import MemoryPages, MemorySearch  # noqa: E402

DOCS = [{"title": f"Entity {i}", "url": f"https://hexwiki.test/wiki/E{i}",
         "contents": f"Entity {i} is a town in the province of P{i % 7}. It was founded in {1500 + i} "
                     f"by the guild of {i % 11} masons."} for i in range(200)]
PAGE = " ".join(f"Sentence {i} about the old harbour of Varnholt and its {i} towers." for i in range(150))
ITEM = QAItem("bench", "In what year was Varnholt founded?", ["1642"])


class Script:
    """search, search, access (3 chunks); every result read; answers at call `turns`."""

    def __init__(self, tok, turns: int):
        self.turns, self.calls, self.acts = turns, 0, 0
        enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
        self.note = [enc(f"Note {i}: the page says little about the founding.</think>") for i in range(50)]
        self.search = [enc(f"<think>try another angle {i}</think>\n<search>Entity {i} founded</search>")
                       for i in range(200)]
        self.access = enc("<think>open the page</think>\n<access>https://hexwiki.test/wiki/Varnholt</access>")
        self.answer = enc("<think>enough</think>\n<answer>1642</answer>")

    def __call__(self, prompt_ids, request):
        self.calls += 1
        if request.sampling.stop == ["</think>"]:
            return self.note[self.calls % 50]
        self.acts += 1
        if self.calls >= self.turns:
            return self.answer
        return self.access if self.acts % 3 == 0 else self.search[self.acts % 200]


def config(policy: str, turns: int) -> AgentConfig:
    full = policy == "full"
    return AgentConfig(context_policy=policy, max_turns=turns + 10, max_tool_calls=10 * turns, max_new_tokens=64,
                       max_context_tokens=10**7 if full else 8192, wall_clock_s=3600.0)


class Retokenize:
    """The text-space baseline: render the whole history to text and tokenise it again before each call.

    Only the measured turns (the first and last 50) pay it: the work is stateless, so skipping it in
    the untimed middle changes nothing that is measured and saves minutes.
    """

    def __init__(self, engine: ScriptedEngine, tok, turns: int):
        self.engine, self.tok, self.turns, self.calls = engine, tok, turns, 0
        self.version, self.tokenizer = engine.version, engine.tokenizer

    async def generate(self, request):
        self.calls += 1
        if self.calls <= 51 or self.calls > self.turns - 51:
            ids = self.tok.encode(self.tok.decode(request.prompt_ids), add_special_tokens=False)
            assert len(ids) > 0
        return await self.engine.generate(request)


async def episode(tok, policy: str, turns: int, trace_memory: bool = False, baseline: bool = False) -> dict:
    engine = ScriptedEngine(responder=Script(tok, turns), tokenizer=tok, record=False)
    if baseline:
        engine = Retokenize(engine, tok, turns)
    agent = Agent(engine, {"search": MemorySearch(DOCS, topk=3), "access": MemoryPages(
        {"https://hexwiki.test/wiki/Varnholt": PAGE})}, config(policy, turns))
    stamps: list[tuple[float, float]] = []

    def on_event(e: AgentEvent) -> None:
        if e.kind == "llm":
            stamps.append((time.process_time(), time.perf_counter()))

    gc.collect()
    gc.freeze()  # the interpreter's existing heap (transformers, tokenizer) is not the agent's to scan
    if trace_memory:
        tracemalloc.start()
    t0 = time.perf_counter()
    start = (time.process_time(), t0)
    traj = await agent.run(ITEM, on_event=on_event)
    peak = tracemalloc.get_traced_memory()[1] / 2**20 if trace_memory else None
    if trace_memory:
        tracemalloc.stop()
    gc.unfreeze()
    assert traj.stop_reason == "answered" and traj.num_turns >= turns, (traj.stop_reason, traj.num_turns)
    cpu = [b[0] - a[0] for a, b in zip([start, *stamps], stamps, strict=False)]
    wall = [b[1] - a[1] for a, b in zip([start, *stamps], stamps, strict=False)]
    first, last = statistics.mean(cpu[:50]), statistics.mean(cpu[turns - 50:turns])
    wall_ratio = statistics.mean(wall[turns - 50:turns]) / statistics.mean(wall[:50])
    ctx = [t["prompt_tokens"] for t in traj.meta["turns"]]
    return {"ratio": last / first, "first_ms": first * 1e3, "last_ms": last * 1e3, "wall_ratio": wall_ratio,
            "total_s": time.perf_counter() - t0, "segments": len(traj.segments), "tokens": sum(map(len, traj.segments)),
            "ctx_tokens_first50": statistics.mean(ctx[:50]), "ctx_tokens_last50": statistics.mean(ctx[-50:]),
            "dropped_turns": traj.meta["dropped_turns"], "peak_mem_mb": peak}


async def measure(tok, policy: str, turns: int, repeats: int) -> dict:
    """`repeats` episodes of ours and of the re-tokenising baseline under `policy`, alternating."""
    ours, base = [], []
    for _ in range(repeats):
        ours.append(await episode(tok, policy, turns))
        base.append(await episode(tok, policy, turns, baseline=True))
    mem = await episode(tok, policy, turns, trace_memory=True)
    median = sorted(ours, key=lambda r: r["ratio"])[len(ours) // 2]
    return {"ratio": spread(r["ratio"] for r in ours), "baseline_ratio": spread(r["ratio"] for r in base),
            "vs_baseline_last50": spread(b["last_ms"] / o["last_ms"] for o, b in zip(ours, base, strict=True)),
            "wall_ratio": spread(r["wall_ratio"] for r in ours), "median_run": median,
            "baseline_last_ms": spread(r["last_ms"] for r in base), "peak_mem_mb": mem["peak_mem_mb"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/agent_turn_cost.json)")
    args = ap.parse_args()
    tok = load_tokenizer("tiny-random")  # the SmolLM2 tokenizer
    results = {}
    for policy in ("read_once", "keep_last_k", "full"):
        r = results[policy] = asyncio.run(measure(tok, policy, args.turns, args.repeats))
        m = r["median_run"]
        print(f"{policy:12s} ours {fmt(r['ratio'])}  baseline {fmt(r['baseline_ratio'])}  "
              f"baseline/ours last 50 {fmt(r['vs_baseline_last50'], 1)}x  turn {m['first_ms']:.2f} -> "
              f"{m['last_ms']:.2f} ms  ctx {m['ctx_tokens_first50']:.0f} -> {m['ctx_tokens_last50']:.0f} tokens  "
              f"peak_mem={r['peak_mem_mb']:.1f} MB", flush=True)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    full, ro = results["full"], results["read_once"]
    growth = full["median_run"]["ctx_tokens_last50"] / full["median_run"]["ctx_tokens_first50"]
    line = (f"RESULT agent_turn_cost {kv('ratio', full['ratio'])} "
            f"{kv('read_once_ratio', ro['ratio'])} {kv('keep_last_k_ratio', results['keep_last_k']['ratio'])} "
            f"full_ctx_growth={growth:.1f}x {kv('baseline_full_ratio', full['baseline_ratio'])} "
            f"vs_baseline_full_last50={full['vs_baseline_last50']['median']:.1f}x "
            f"vs_baseline_read_once_last50={ro['vs_baseline_last50']['median']:.1f}x "
            f"peak_mem_mb={ro['peak_mem_mb']:.1f} peak_rss_mb={rss:.0f} repeats={args.repeats} target_full<=1.1")
    write_result("agent_turn_cost", line, {"ratio": full["ratio"], "read_once_ratio": ro["ratio"],
                                           "keep_last_k_ratio": results["keep_last_k"]["ratio"],
                                           "vs_baseline_full_last50": full["vs_baseline_last50"]},
                 {"turns": args.turns, "repeats": args.repeats, "peak_rss_mb": rss, "policies": results}, args.out)
    print(line)


if __name__ == "__main__":
    main()
