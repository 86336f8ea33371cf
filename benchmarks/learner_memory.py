"""Learner memory per rank under `ddp` and `fsdp2`, measured and against the planner's memory model.

Two parts. (1) The memory model's error: for the tiny random model and SmolLM2-135M, under `ddp` and `fsdp2`, on 1
and 2 ranks, the measured peak per rank (below) against `trainer.planner.memory.learner_memory` for the same model
(its config and exact parameter count), ranks, micro-batch, policy fraction and fp32 compute:

    predicted_error  = the largest |measured - predicted| / measured over the 8 cells (each cell's median over
                       rounds); target <= 0.15
    runtime          = resident memory after the steps minus the counted state (ddp with 2 ranks: and its
                       gradient buckets), per cell: the model's constant `runtime` term, measured beside it

(2) The strategies compared on the quickstart model with 2 ranks (the figures below).

Each round starts 2 ranks (torch.multiprocessing, a real gloo process group, 1 torch thread each, as the
quickstart's learner) per strategy, builds `trainer.learner.Learner` on `smollm2-135m-instruct` with
fp32 master weights (`train.precision=fp32`, the same on every CPU) and trains --steps steps on the same
synthetic batch (B x G sequences of --tokens random tokens, half of them policy tokens, advantages +-1;
shared by the ranks by tokens as trainer/learner_group.py does). Per rank it records:

    state bytes   bytes of this rank's parameters, gradients and AdamW moments after the last step
                  (its shards under fsdp2), counted from the tensors
    peak bytes    the highest resident memory during the steps (sampled every 2 ms from /proc/self/statm)
                  minus the resident memory of the same process before the model was loaded (Python,
                  torch, transformers, the tokenizer, the gloo process group and the model's code, imported
                  by building it on the meta device): what the learner itself occupies, activations
                  and the gathered layers included. The ranks run with MALLOC_MMAP_THRESHOLD_=65536, so
                  every block over 64 KiB is its own mapping, returned to the OS when freed: resident
                  memory then follows the live tensors (with glibc's default, memory freed during a step
                  stays resident until trimmed, and both strategies read ~1.05x apart on that account)
    step s        wall seconds of the steps after the first (the first one allocates the AdamW moments),
                  from a second pair of ranks per strategy and round that runs with glibc's default
                  allocator (mapping every block costs time, and more so for fsdp2's many buffers)

    ratio            = ddp peak bytes per rank / fsdp2 peak bytes per rank   (the larger rank of each)
    state_ratio      = ddp state bytes per rank / fsdp2 state bytes per rank (expected ~2 for 2 ranks)
    step_time_ratio  = fsdp2 step s / ddp step s                              (the price of the gathers)

Rounds (--rounds, default 3) alternate which strategy runs first; every figure is the median over rounds
with its range (benchmarks/_common.py). The figures are wall-clock on a possibly shared machine: run it
under the shared CPU lock.

    python benchmarks/learner_memory.py [--rounds 3] [--steps 3] [--batch 4] [--group 2] [--tokens 160]
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import fmt, kv, spread, write_result  # noqa: E402

MODEL = "smollm2-135m-instruct"
MODELS = ("tiny-random", MODEL)


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _Peak:
    """The highest resident memory of this process while running, sampled by a thread."""

    def __init__(self):
        self.peak, self._stop = _rss(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _batch(args, vocab: int):
    from trainer.packing import Sample

    rng = random.Random(0)
    out = []
    for i in range(args.batch * args.group):
        ids = [rng.randrange(100, vocab) for _ in range(args.tokens)]
        half = args.tokens // 2
        mask = [0] * half + [1] * (args.tokens - half)
        out.append(Sample(ids, mask, [-2.0] * args.tokens, [0] * args.tokens, advantage=1.0 if i % 2 else -1.0))
    return out


def _rank(rank: int, world: int, port: int, strategy: str, args, out, model: str = MODEL) -> None:
    import torch
    import torch.distributed as dist

    from core.memory import release_free_memory
    from serving.models import load_tokenizer
    from trainer.config import LearnerConfig, TrainConfig
    from trainer.learner import Learner
    from trainer.learner_group import split_by_tokens

    torch.set_num_threads(1)
    vocab = len(load_tokenizer(model))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    _import_model_code(model)
    release_free_memory()
    base = _rss()  # after the process group and the model's code: the runtime, not what the model needs
    cfg = TrainConfig(precision="fp32", lr=1e-5, micro_batch_tokens=args.tokens * 2,
                      learner=LearnerConfig(strategy=strategy))
    learner = Learner(cfg, model, rank=rank, world_size=world)
    share = split_by_tokens(_batch(args, vocab), world)[rank]
    release_free_memory()  # the full model every rank loaded before sharding: gone before the steps
    times = []
    with _Peak() as peak:
        for step in range(args.steps):
            t0 = time.perf_counter()
            learner.train_step(share, version=step)
            times.append(time.perf_counter() - t0)
    local = [getattr(p, "_local_tensor", p) for p in learner.params]
    state = sum(t.numel() * t.element_size() for t in local)
    state += sum(getattr(p.grad, "_local_tensor", p.grad).nbytes for p in learner.params if p.grad is not None)
    state += sum(getattr(v, "_local_tensor", v).nbytes for s in learner.optimizer.state.values()
                 for v in s.values() if torch.is_tensor(v))
    release_free_memory()
    # resident after the steps, beyond the counted state (and DDP's buckets): the model's `runtime` term, seen
    out[rank] = {"peak": peak.peak - base, "state": state, "step_s": sum(times[1:]) / max(1, len(times) - 1),
                 "after": _rss() - base}
    dist.destroy_process_group()


def _import_model_code(model: str) -> None:
    """Import what building the learner imports (the model's modeling module, FSDP), so that code is in the base."""
    import torch
    import torch.distributed.fsdp  # noqa: F401
    from transformers import AutoConfig, AutoModelForCausalLM

    from serving.models import resolve_model

    with torch.device("meta"):
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(resolve_model(model)))


def _spawn(strategy: str, args, mmap_threshold: str | None, model: str = MODEL, world: int = 2) -> list[dict]:
    """Run the ranks (glibc reads MALLOC_MMAP_THRESHOLD_ when each rank process starts)."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    saved = os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
    if mmap_threshold:
        os.environ["MALLOC_MMAP_THRESHOLD_"] = mmap_threshold
    try:
        mp.spawn(_rank, args=(world, port, strategy, args, out, model), nprocs=world, join=True)
    finally:
        os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
        if saved is not None:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = saved
    return [dict(out[r]) for r in range(world)]


def predicted_peak(model: str, strategy: str, world: int, args) -> float:
    """The memory model's bytes per rank for one cell: the rank's micro-batch is its share of the step's tokens,
    at most `micro_batch_tokens` (2 samples); half of every sample is policy tokens; fp32 compute; no
    gradient checkpointing (the learner's default)."""
    from trainer.planner.memory import CPU_RUNTIME_BYTES, learner_memory, model_spec_of

    rank_tokens = args.batch * args.group * args.tokens / world
    return learner_memory(model_spec_of(model, bytes_per_param=4), strategy=strategy, ranks=world,
                          micro_batch_tokens=min(rank_tokens, args.tokens * 2), checkpointing=False,
                          policy_fraction=(args.tokens - args.tokens // 2) / args.tokens, compute_bytes=4,
                          runtime_bytes=CPU_RUNTIME_BYTES).total


def _grid(args) -> dict[str, dict]:
    """One memory run per (model, ranks, strategy) cell: measured peak (the larger rank) and predicted bytes."""
    cells = {}
    for model in MODELS:
        for world in (1, 2):
            for strategy in ("ddp", "fsdp2"):
                ranks = _spawn(strategy, args, "65536", model, world)
                peak, pred = max(r["peak"] for r in ranks), predicted_peak(model, strategy, world, args)
                buckets = max(r["state"] for r in ranks) / 4 if strategy == "ddp" and world > 1 else 0
                runtime = max(r["after"] - r["state"] - buckets for r in ranks)
                cells[f"{model}/{strategy}/{world}"] = {"peak": peak, "predicted": pred, "ranks": ranks,
                                                        "error": abs(peak - pred) / peak, "runtime": runtime}
                print(f"  {model} {strategy} x{world}: measured {peak / 2**20:.0f} MiB, predicted "
                      f"{pred / 2**20:.0f} MiB, error {abs(peak - pred) / peak:.3f}, runtime "
                      f"{runtime / 2**20:.0f} MiB", flush=True)
    return cells


def _measure(strategy: str, args, memory: list[dict] | None = None) -> dict:
    memory = memory or _spawn(strategy, args, "65536")
    timing = _spawn(strategy, args, None) if args.timing else memory
    return {"peak": max(r["peak"] for r in memory), "state": max(r["state"] for r in memory),
            "step_s": max(r["step_s"] for r in timing), "memory_ranks": memory, "timing_ranks": timing}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4, help="questions per step")
    ap.add_argument("--group", type=int, default=2, help="samples per question")
    ap.add_argument("--tokens", type=int, default=160, help="tokens per sample")
    ap.add_argument("--no-timing", dest="timing", action="store_false",
                    help="skip the default-allocator runs (step_time_ratio then comes from the memory runs)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rounds, grids = [], []
    for r in range(args.rounds):
        order = ("ddp", "fsdp2") if r % 2 == 0 else ("fsdp2", "ddp")
        grid = _grid(args)
        grids.append(grid)
        got = {s: _measure(s, args, grid[f"{MODEL}/{s}/2"]["ranks"]) for s in order}
        rounds.append(got)
        print(f"round {r + 1}: " + "  ".join(f"{s} peak {got[s]['peak'] / 2**20:.0f} MiB state "
                                              f"{got[s]['state'] / 2**20:.0f} MiB step {got[s]['step_s']:.2f}s"
                                              for s in ("ddp", "fsdp2")), flush=True)
    ratio = spread([g["ddp"]["peak"] / g["fsdp2"]["peak"] for g in rounds])
    state_ratio = spread([g["ddp"]["state"] / g["fsdp2"]["state"] for g in rounds])
    step_ratio = spread([g["fsdp2"]["step_s"] / g["ddp"]["step_s"] for g in rounds])
    errors = {cell: spread([g[cell]["error"] for g in grids]) for cell in grids[0]}
    predicted_error = max(e["median"] for e in errors.values())
    for cell, e in errors.items():
        print(f"{cell}: measured {spread([g[cell]['peak'] / 2**20 for g in grids])['median']:.0f} MiB, predicted "
              f"{grids[0][cell]['predicted'] / 2**20:.0f} MiB, error {fmt(e, 3)}")
    line = " ".join(["RESULT learner_memory", kv("ratio", ratio), kv("step_time_ratio", step_ratio),
                     kv("state_ratio", state_ratio), f"predicted_error={predicted_error:.3f}"])
    print(f"peak ratio {fmt(ratio)}  state ratio {fmt(state_ratio)}  fsdp2/ddp step time {fmt(step_ratio)}")
    peaks = {s: spread([g[s]["peak"] / 2**20 for g in rounds]) for s in ("ddp", "fsdp2")}
    write_result("learner_memory", line, {"ratio": ratio, "step_time_ratio": step_ratio, "state_ratio": state_ratio,
                                          "predicted_error": predicted_error},
                 {"args": vars(args), "peak_mib": peaks, "rounds": rounds, "model": MODEL, "ranks": 2,
                  "model_cells": {c: {"errors": e, "predicted_mib": grids[0][c]["predicted"] / 2**20,
                                      "measured_mib": [g[c]["peak"] / 2**20 for g in grids],
                                      "runtime_mib": [g[c]["runtime"] / 2**20 for g in grids]}
                                  for c, e in errors.items()},
                  "memory_runs_malloc_mmap_threshold": 65536})
    print(line)


if __name__ == "__main__":
    main()
