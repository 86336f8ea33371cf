"""Data-parallel learners as Ray actors (gloo): two ranks train like one learner on the whole batch, under
`ddp` and under `fsdp2` (whose export every rank takes part in and rank 0 returns)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from hexsearch.config import load_config
from trainer.config import TrainConfig
from trainer.learner import Learner
from trainer.learner_group import LearnerGroup
from trainer.placement import init_ray

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_two_ray_learner_ranks_equal_one_learner(tiny_model_spec, strategy):
    import ray
    from test_learner import _samples

    # fp32 forward and fp32 export, as the single learner below, on every CPU (`auto` is bf16 with AVX512_BF16)
    cfg = load_config(None, [f"engine.model={tiny_model_spec}", "train.learner_workers=2", "train.lr=1e-2",
                             "train.grad_clip=0.5", "agent.temperature=1.0", "train.precision=fp32",
                             "engine.dtype=float32", f"train.learner.strategy={strategy}"])
    init_ray(cfg.train)
    try:
        group = LearnerGroup(cfg, {"num_cpus": 1}, threads=1)
        stats = asyncio.run(group.train_step(_samples(), version=0))
        ranks = ray.get([group.export_ref(), *([] if group.sharded else [group.actors[1].export_weights.remote()])])
    finally:
        ray.shutdown()
    single = Learner(TrainConfig(precision="fp32", lr=1e-2, grad_clip=0.5), tiny_model_spec)
    ref = single.train_step(_samples(), version=0)
    assert stats["train/policy_tokens"] == ref["train/policy_tokens"]
    for name in ("train/logp_mismatch", "train/logp_mismatch_fresh", "train/fresh_tokens"):  # all-reduced sums
        assert stats[name] == pytest.approx(ref[name], abs=1e-4), name
    want = single.export_weights()
    for k, v in want.items():
        assert torch.allclose(ranks[0][k], v, atol=1e-6), k
        if not group.sharded:
            assert torch.equal(ranks[0][k], ranks[1][k]), k   # the replicas never drift apart
