"""The planner's terms that a run's shape decides: tokens per trajectory, the KV context a decoding slot holds (its
time average, which both the per-step KV read and the KV-capacity bound use), training steps whose length follows the
groups dynamic filtering keeps, and refused groups giving their admission slot back."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from trainer.planner.config import PlanConfig
from trainer.planner.costs import (
    GenOption,
    TrainOption,
    growth_tokens,
    kv_context,
    max_decode_batch,
    tokens_per_trajectory,
)
from trainer.planner.milp import Problem, Solution
from trainer.planner.simulator import simulate
from trainer.planner.specs import ModelSpec, WorkloadSpec, load_catalog, load_spec, lognormal_sigma

PLANNER = Path(__file__).resolve().parents[1] / "configs" / "planner"


def test_tool_results_follow_all_turns_but_the_first():
    # 3 LLM calls -> 2 tool calls -> 2 tool results in the context (and in training), not 3
    w = WorkloadSpec(prompt_tokens=50, response_tokens_mean=20, response_tokens_p99=20, turns=3,
                     tool_tokens_per_turn=100)
    assert growth_tokens(w) == 220
    assert tokens_per_trajectory(w) == 270
    assert tokens_per_trajectory(WorkloadSpec(prompt_tokens=50, response_tokens_mean=20, turns=1,
                                              tool_tokens_per_turn=100)) == 70


def test_kv_context_equal_lengths_is_prompt_plus_half():
    w = WorkloadSpec(prompt_tokens=300, response_tokens_mean=4000, response_tokens_p99=4000)
    assert kv_context(w) == pytest.approx(300 + 2000)


def test_kv_context_is_the_time_average_of_a_slot():
    """A slot decodes log-normal trajectories back to back; the context it holds, averaged over decode steps,
    is the length-biased mean (long trajectories hold the slot longer, with more context)."""
    w = WorkloadSpec(prompt_tokens=300, response_tokens_mean=4096, response_tokens_p99=14000)
    sigma = lognormal_sigma(w.response_tokens_mean, w.response_tokens_p99, from_mean=True)
    rng = np.random.default_rng(0)
    lengths = np.exp(math.log(4096) - sigma ** 2 / 2 + sigma * rng.standard_normal(200_000))
    # a trajectory of length L spends L steps in the slot with mean context prompt + L/2
    time_average = 300 + float((lengths * lengths / 2).sum() / lengths.sum())
    assert kv_context(w) == pytest.approx(time_average, rel=0.02)
    assert kv_context(w) > 300 + 4096 / 2 * 1.3  # the tail weighs: well above prompt + mean / 2


def test_kv_capacity_uses_the_time_average_context():
    types = load_catalog(PLANNER / "gpus.yaml")
    m = load_spec(PLANNER / "models" / "qwen2.5-14b.yaml", ModelSpec)
    w = load_spec(PLANNER / "workloads" / "math.yaml", WorkloadSpec)
    cfg = PlanConfig(max_decode_batch=100_000)
    free = 80e9 * cfg.memory_fraction - m.params_b * 1e9 * m.bytes_per_param
    assert max_decode_batch(types["H800"], m, w, cfg, 1) == int(free // (kv_context(w) * m.kv_bytes_per_token))
    # a longer tail at the same mean: more context per slot, fewer slots
    longer = WorkloadSpec(**{**w.__dict__, "response_tokens_p99": 2 * w.response_tokens_p99})
    assert max_decode_batch(types["H800"], m, longer, cfg, 1) < max_decode_batch(types["H800"], m, w, cfg, 1)


def pipeline(gen_batch_s: float, tau: float, fixed: float, eta: int, p99: float = 100.0) -> tuple:
    """One engine that generates a batch of B G = 32 trajectories of mean 100 tokens in about `gen_batch_s` seconds
    (32 slots), a trainer of mean step `tau` with `fixed` seconds that do not scale with the kept groups."""
    step = gen_batch_s / 100
    w = WorkloadSpec(prompt_tokens=0, response_tokens_mean=100, response_tokens_p99=p99, turns=1, batch_size=8,
                     group_size=4, max_staleness=eta)
    gen = GenOption("X", 1, 32, step, 32 / gen_batch_s, gen_batch_s, gen_batch_s, 32, step, 0.0)
    p = Problem(gen=[gen], train=[TrainOption("X", 1, 1, 1, tau, 1.0, fixed)], counts={"X": 2}, prices={"X": 1.0},
                batch_samples=32, sync_s=0.0, max_staleness=eta)
    return p, w, Solution({0: 1}, 0, 0, 0, 0)


def test_kept_groups_vary_the_step_and_short_steps_wait_for_generation():
    # generation (8 s a batch) is faster than the mean step (12 s) but slower than a step that kept few groups
    p, w, s = pipeline(gen_batch_s=8.0, tau=12.0, fixed=3.0, eta=1)
    every = simulate(p, s, w, steps=200)                                             # every group trained
    filtered = simulate(p, s, WorkloadSpec(**{**w.__dict__, "trained_fraction": 0.37}), steps=200)
    assert every.throughput == pytest.approx(32 / 12.0, rel=0.02) and every.trainer_idle < 0.01
    assert filtered.trainer_idle > 0.01 and filtered.throughput < 0.97 * every.throughput
    # generation far faster than any step: only the mean step counts, as in the closed form
    p, w, s = pipeline(gen_batch_s=1.0, tau=12.0, fixed=3.0, eta=1)
    fast = simulate(p, s, WorkloadSpec(**{**w.__dict__, "trained_fraction": 0.37}), steps=400)
    assert fast.throughput == pytest.approx(32 / 12.0, rel=0.05)


def test_a_refused_group_frees_its_admission_slot():
    """Long-tailed trajectories and short steps make the trainer refuse stale groups; each refusal lets a
    replacement start (trainer/staleness.py), so refusals cost their work, not a permanent batch slot."""
    p, w, s = pipeline(gen_batch_s=6.0, tau=6.5, fixed=0.0, eta=1, p99=1200.0)
    sim = simulate(p, s, w, steps=200)
    assert sim.refused > 0
    assert max(sim.staleness) <= 1
    # a third of the groups are refused here; were their slots never given back, the pipeline would starve after
    # B of them (0.48 samples/s, a tenth of the trainer's 4.9)
    assert sim.throughput > 0.3 * 32 / 6.5


def test_profile_gives_synthetic_sequences_the_workloads_policy_tokens():
    from trainer.planner.profile import _policy_mask

    assert _policy_mask(10, 4) == [1, 1, 0, 0, 0, 0, 0, 0, 1, 1]  # two turns around a tool result
    assert _policy_mask(5, 0) == [1] * 5 and _policy_mask(5, 9) == [1] * 5
    assert sum(_policy_mask(100, 17)) == 17
