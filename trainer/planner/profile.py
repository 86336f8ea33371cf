"""`hexsearch plan profile`: measure this machine's engine and learner and write a device entry.

One device is one CPU core here (one engine thread or one learner thread). Measured, with the configured
model (`engine.model`), engine settings and learner settings, each thread count pinned to 1:

    decode:  t(b, n) = wall time of b concurrent requests of a `prompt_tokens` prompt, n new tokens each;
             t_step(b) = (t(b, n2) - t(b, n1)) / (n2 - n1)  ->  decode_base_s = t_step(1),
             decode_per_seq_s = (t_step(b) - t_step(1)) / (b - 1)
    prefill: prompt_tokens / (t(1, 1) - t_step(1))
    train:   learner steps of B and B/2 groups (G sequences of `train_tokens` tokens; all share a system
             prefix, a group its prompt) with the configured pi_prox mode and packing, after a warm-up step:
             t = fixed + tokens / rate through the two medians, tokens counted beyond the shared system prefix
             (the learner computes that prefix once per step, so it sits in `fixed`)
    sync:    wall time of pause + update_weights(the learner's full state, serialised and loaded back as
             it crosses Ray's object store in a run) + resume on an engine
Each figure is the median of `repeats` measurements.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from dataclasses import replace
from typing import Any

from serving.config import EngineConfig
from trainer.config import FullConfig, TrainConfig
from trainer.planner.specs import MeasuredSpeed

_calls = 0


async def _timed_batch(engine: Any, prompt: list[int], batch: int, new_tokens: int) -> float:
    from serving.protocol import GenerateRequest, SamplingParams

    global _calls
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, ignore_eos=True, seed=0)
    prompts = []
    for _ in range(batch):  # a distinct first token per request: the prefix cache never answers a prefill
        _calls += 1
        prompts.append([1000 + _calls % 20000] + list(prompt[1:]))
    t0 = time.perf_counter()
    await asyncio.gather(*(engine.generate(GenerateRequest(ids, params)) for ids in prompts))
    return time.perf_counter() - t0


def measure_engine(engine_cfg: EngineConfig, prompt_tokens: int, batch: int, n1: int = 8, n2: int = 40,
                   repeats: int = 3) -> dict[str, float]:
    """decode_base_s, decode_per_seq_s and prefill_tokens_per_s of one single-threaded embedded engine."""
    from serving.factory import build_engine

    engine = build_engine(replace(engine_cfg, threads=1, max_batch_size=max(batch, 1)))
    try:
        tok = engine.tokenizer
        filler = tok.encode("The city of Varnholt was founded in 1642 by Dalia Orrent. " * 200)[:prompt_tokens]

        async def med(b: int, n: int) -> float:
            return statistics.median([await _timed_batch(engine, filler, b, n) for _ in range(repeats)])

        async def run() -> dict[str, float]:
            await _timed_batch(engine, filler, 1, 2)  # warm-up
            return {"t1_n1": await med(1, n1), "t1_n2": await med(1, n2), "tb_n1": await med(batch, n1),
                    "tb_n2": await med(batch, n2), "t1_1": await med(1, 1)}

        t = asyncio.run(run())
    finally:
        engine.close()
    step1 = (t["t1_n2"] - t["t1_n1"]) / (n2 - n1)
    stepb = (t["tb_n2"] - t["tb_n1"]) / (n2 - n1)
    return {"decode_base_s": step1, "decode_per_seq_s": max(stepb - step1, 0.0) / max(batch - 1, 1),
            "prefill_tokens_per_s": prompt_tokens / max(t["t1_1"] - step1, 1e-6), "max_batch": batch}


def measure_learner(train_cfg: TrainConfig, model: str, groups: int, group_size: int, train_tokens: int, prompt_tokens: int,
                    shared_prefix: int, repeats: int = 2, policy_tokens: int = 0) -> tuple[float, float, Any]:
    """(training tokens/s, fixed seconds per step, the learner) of one single-threaded learner. Steps of `groups`
    and of `groups // 2` groups of `group_size` sequences of `train_tokens` tokens: all share the first
    `shared_prefix` prompt tokens, a group shares its whole prompt. The two step times give the line
    t = fixed + tokens / rate, tokens = sequences x (train_tokens - shared_prefix): the learner runs the
    step-wide shared prefix once (its stem), so that prefix and the optimizer step cost the same at any size.
    `policy_tokens` > 0: only that many tokens after the prompt are policy tokens (loss mask 1, half before and half
    after the tool-result tokens, as in a two-turn episode); the learner computes logits only there, so a workload's
    share of policy tokens changes its cost per token."""
    import random

    import torch

    from trainer.learner import Learner
    from trainer.packing import Sample

    torch.set_num_threads(1)
    learner = Learner(replace(train_cfg, learner_workers=1), model)
    rng = random.Random(0)
    vocab = min(learner.tokenizer.vocab_size, 30000)
    system = [rng.randrange(100, vocab) for _ in range(min(shared_prefix, prompt_tokens))]

    def batch(n_groups: int) -> list[Sample]:
        out = []
        for _ in range(n_groups):
            prompt = system + [rng.randrange(100, vocab) for _ in range(prompt_tokens - len(system))]
            for i in range(group_size):
                gen = [rng.randrange(100, vocab) for _ in range(train_tokens - prompt_tokens)]
                mask = [0] * prompt_tokens + _policy_mask(len(gen), policy_tokens)
                out.append(Sample(prompt + gen, mask, [-1.0] * len(mask), [0] * len(mask), (-1.0) ** i))
        return out

    learner.train_step(batch(max(groups // 2, 1)), 0)  # warm-up
    step = 0

    def timed(n_groups: int) -> float:
        nonlocal step
        times = []
        for _ in range(repeats):
            step += 1
            samples = batch(n_groups)
            t0 = time.perf_counter()
            learner.train_step(samples, step)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    small, large = max(groups // 2, 1), max(groups, 2)
    t_small, t_large = timed(small), timed(large)
    computed = max(train_tokens - min(shared_prefix, prompt_tokens), 1)  # tokens per sequence beyond the stem
    per_token = max(t_large - t_small, 1e-9) / ((large - small) * group_size * computed)
    fixed = max(t_large - per_token * large * group_size * computed, 0.0)
    return 1.0 / per_token, fixed, learner


def _policy_mask(n: int, policy: int) -> list[int]:
    """Loss mask of the n tokens after the prompt: all policy (policy <= 0), else `policy` ones split around the
    tool-result zeros."""
    if policy <= 0 or policy >= n:
        return [1] * n
    first = policy // 2
    return [1] * first + [0] * (n - policy) + [1] * (policy - first)


def measure_sync(learner: Any, engine_cfg: EngineConfig, repeats: int = 3) -> float:
    """Seconds to export the learner's weights and load them into an embedded engine (pause, swap, resume)."""
    from safetensors.torch import load, save

    from serving.factory import build_engine

    engine = build_engine(replace(engine_cfg, threads=1))
    try:
        async def once(version: int) -> float:
            t0 = time.perf_counter()
            await engine.pause()
            # the weights cross a process boundary in a run (Ray's object store): a serialise + load round trip
            blob = save({k: v.detach().clone().contiguous() for k, v in learner.export_weights(changed_only=False).items()})
            await engine.update_weights(load(blob), version)
            await engine.resume()
            return time.perf_counter() - t0

        async def run() -> float:
            return statistics.median([await once(v + 1) for v in range(repeats)])

        return asyncio.run(run())
    finally:
        engine.close()


def profile_device(cfg: FullConfig, prompt_tokens: int, train_tokens: int, batch: int, shared_prefix: int = 0,
                   policy_tokens: int = 0) -> MeasuredSpeed:
    """The measured speeds of this machine for the configured model (engine, then learner, then weight sync)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    eng = measure_engine(cfg.engine, prompt_tokens, batch)
    train_tps, fixed, learner = measure_learner(cfg.train, cfg.engine.model, cfg.train.batch_size, cfg.train.group_size,
                                                train_tokens, prompt_tokens, shared_prefix, policy_tokens=policy_tokens)
    sync = measure_sync(learner, cfg.engine)
    return MeasuredSpeed(model=cfg.engine.model, decode_base_s=eng["decode_base_s"],
                         decode_per_seq_s=eng["decode_per_seq_s"], prefill_tokens_per_s=eng["prefill_tokens_per_s"],
                         train_tokens_per_s=train_tps, train_fixed_s=fixed, max_batch=int(eng["max_batch"]),
                         weight_sync_s=sync)


def device_yaml(name: str, speed: MeasuredSpeed, cores: int) -> str:
    """A cluster file: one node of `cores` single-core devices with the measured speeds."""
    from dataclasses import asdict

    import psutil
    from omegaconf import OmegaConf

    memory = round(psutil.virtual_memory().total / 1e9 / cores, 1)  # a core's share of the machine's memory
    doc = {"gpus": {name: {"hbm_gb": memory, "hbm_tbps": 0, "bf16_tflops": 0, "price_per_hour": 1.0, "intra_node_gbps": 10.0,
                           "cpu": True, "source": "measured by `hexsearch plan profile` on this machine",
                           "price_source": "nominal: one core = $1/h", "measured": asdict(speed)}},
           "pools": [{"name": "local", "gpu": name, "nodes": 1, "gpus_per_node": cores, "nic_gbps": 10.0}]}
    return "# this machine, profiled: one device = one CPU core\n" + OmegaConf.to_yaml(OmegaConf.create(doc))
