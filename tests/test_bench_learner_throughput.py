"""benchmarks/learner_throughput.py counts FLOPs for what the learner computes: causal attention context per
query, the lm_head only where it is evaluated, and a shared stem once."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import learner_throughput as lt  # noqa: E402

DIMS = {"d_model": 4, "layers": 2, "vocab": 10, "dense_params": 100}


def test_flops_count_dense_causal_attention_and_the_evaluated_head():
    # one 3-token sequence: queries attend to 1, 2, 3 keys
    assert lt._ctx_sum(0, 3) == 6 and lt._ctx_sum(2, 3) == 3 and lt._ctx_sum(3, 3) == 0
    got = lt.flops(DIMS, [(0, 3)], head_positions=2)
    assert got == 6 * 100 * 3 + 12 * 2 * 4 * 6 + 6 * 4 * 10 * 2
    # a prefix computed once, then two rows continuing it: the prefix's tokens are not counted twice
    shared = lt.flops(DIMS, [(0, 2), (2, 5), (2, 4)], head_positions=0)
    assert shared == 6 * 100 * (2 + 3 + 2) + 12 * 2 * 4 * (lt._ctx_sum(0, 2) + lt._ctx_sum(2, 5) + lt._ctx_sum(2, 4))


def test_agent_sequences_look_like_long_horizon_episodes():
    samples = lt.agent_sequences(5000, questions=2, group=2, lengths=(1000, 2600), system_tokens=200, seed=3)
    assert len(samples) == 4 and all(1000 <= len(s) <= 2600 for s in samples)
    policy = sum(s.num_loss_tokens for s in samples) / sum(len(s) for s in samples)
    assert 0.05 < policy < 0.3  # a minority of the tokens carry loss
    assert len({tuple(s.token_ids[:200]) for s in samples}) == 1  # one system prompt for all
    assert samples[0].token_ids[:240] == samples[1].token_ids[:240] != samples[2].token_ids[:240]


def test_ours_spans_count_the_stem_once(tiny_model_spec):
    from trainer.config import TrainConfig
    from trainer.learner import Learner

    learner = Learner(TrainConfig(precision="fp32", micro_batch_tokens=300), tiny_model_spec)
    samples = lt.agent_sequences(4000, questions=1, group=2, lengths=(250, 290), system_tokens=30, seed=0)
    spans = lt.ours_spans(learner, samples, stem_length=60)
    assert spans[0] == (0, 60) and sorted(spans[1:]) == sorted((60, len(s)) for s in samples)
    assert sum(b - a for a, b in spans) == sum(map(len, samples)) - 60
