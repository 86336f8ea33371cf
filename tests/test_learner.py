"""The learner on the tiny model: packing, exact log-probs, a step that learns, LoRA export, data parallel."""

from __future__ import annotations

import random

import pytest
import torch

from trainer import learner_state
from trainer.config import TrainConfig
from trainer.learner import Learner
from trainer.learner_group import split_by_tokens
from trainer.packing import Sample, collate, plan_micro_batches


def _samples(n: int = 6, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.randint(12, 40)
        ids = [rng.randint(5, 4000) for _ in range(length)]
        mask = [0] * 6 + [1] * 4 + [0] * 2 + [1] * (length - 12)
        out.append(Sample(ids, mask, [-2.0] * length, [0] * length, advantage=1.0 if i % 2 else -1.0))
    return out


def _reference_logprobs(model, s: Sample) -> list[float]:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([s.token_ids])).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    return [float(lp[t - 1, s.token_ids[t]]) if s.loss_mask[t] and t else 0.0 for t in range(len(s))]


def test_plan_respects_budget_and_covers_every_sample():
    lengths = [50, 10, 30, 30, 70, 5, 120]
    for mode in ("pad", "concat"):
        bins = plan_micro_batches(lengths, 100, mode)
        assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
        for b in bins:
            cost = len(b) * max(lengths[i] for i in b) if mode == "pad" else sum(lengths[i] for i in b)
            assert cost <= 100 or len(b) == 1          # only an oversize sample stands alone
    with pytest.raises(ValueError, match="pad, concat"):
        plan_micro_batches(lengths, 100, "zip")


def test_collate_gathers_only_policy_positions():
    s = Sample([1, 2, 3, 4, 5], [0, 0, 1, 1, 0], [0, 0, -0.5, -0.7, 0], [-1, -1, 3, 4, -1], 2.0)
    mb = collate([s, s], [0, 1], "concat")
    assert mb.input_ids.shape == (1, 10) and mb.attention_mask is None
    assert mb.position_ids[0].tolist() == [0, 1, 2, 3, 4] * 2
    assert mb.pos.tolist() == [1, 2, 6, 7] and mb.targets.tolist() == [3, 4, 3, 4]
    assert mb.behav_logp.tolist() == pytest.approx([-0.5, -0.7] * 2) and mb.versions.tolist() == [3, 4, 3, 4]


@pytest.mark.parametrize("packing", ["pad", "concat"])
def test_logprobs_match_a_plain_forward(tiny_model_spec, packing):
    learner = Learner(TrainConfig(precision="fp32", packing=packing, micro_batch_tokens=64), tiny_model_spec)
    samples = _samples()
    got = learner.logprobs(samples)
    for s, g in zip(samples, got, strict=True):
        assert g == pytest.approx(_reference_logprobs(learner.model, s), abs=2e-4)


def _grouped_samples(groups: int = 3, g: int = 3, seed: int = 0) -> list[Sample]:
    """Samples the way rollouts make them: one system prompt, a question per group, own suffixes."""
    rng = random.Random(seed)
    system = [rng.randint(5, 4000) for _ in range(24)]
    out = []
    for _ in range(groups):
        question = [rng.randint(5, 4000) for _ in range(8)]
        for _ in range(g):
            gen = [rng.randint(5, 4000) for _ in range(rng.randint(3, 9))]
            info = [rng.randint(5, 4000) for _ in range(6)]
            ans = [rng.randint(5, 4000) for _ in range(rng.randint(2, 5))]
            ids = system + question + gen + info + ans
            mask = [0] * (32) + [1] * len(gen) + [0] * 6 + [1] * len(ans)
            out.append(Sample(ids, mask, [-3.0] * len(ids), [0] * len(ids), advantage=rng.choice([-1.0, 1.0])))
    return out


def test_prefix_sharing_is_exact(tiny_model_spec):
    """Shared-prefix forwards (a step-wide stem, then per-group prefixes) give the same log-probs and
    the same update as full forwards."""
    shared = Learner(TrainConfig(precision="fp32", lr=1e-2, share_prefix=True, micro_batch_tokens=400), tiny_model_spec)
    full = Learner(TrainConfig(precision="fp32", lr=1e-2, share_prefix=False, micro_batch_tokens=400), tiny_model_spec)
    samples = _grouped_samples()
    assert shared.share_prefix and not full.share_prefix
    a, b = shared.logprobs(samples), full.logprobs(samples)
    for s, x, y in zip(samples, a, b, strict=True):
        assert x == pytest.approx(y, abs=2e-5)
        assert x == pytest.approx(_reference_logprobs(full.model, s), abs=2e-4)
    shared.train_step(samples, version=0)
    full.train_step(samples, version=0)
    assert shared.stem_tokens >= 24 and full.stem_tokens == 0  # the system prompt ran once for all micro-batches
    for k, v in full.trainable_state().items():
        assert torch.allclose(v, shared.trainable_state()[k], atol=1e-5), k


def test_step_raises_logprob_of_advantaged_tokens(tiny_model_spec):
    cfg = TrainConfig(precision="fp32", lr=1e-2, grad_clip=0, micro_batch_tokens=64)
    learner = Learner(cfg, tiny_model_spec)
    samples = _samples()
    for s, lp in zip(samples, learner.logprobs(samples), strict=True):
        s.logprobs = lp                                 # on-policy: pi_behav = pi_prox
    before = learner.logprobs(samples)
    stats = learner.train_step(samples, version=0)
    after = learner.logprobs(samples)
    assert stats["train/behav_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert stats["train/clip_frac"] == 0.0 and stats["train/optimizer_steps"] == 1
    for s, b, a in zip(samples, before, after, strict=True):
        delta = sum(a) - sum(b)
        assert delta * s.advantage > 0                  # up for A > 0, down for A < 0


def test_logp_mismatch_metrics_report_behaviour_vs_prox(tiny_model_spec):
    """Behaviour log-probs off by +0.1 on fresh tokens (version 3 = the learner's) and by -0.5 on stale
    ones (version 1): the step reports the mean |prox - behav| over all tokens and over fresh ones."""
    learner = Learner(TrainConfig(precision="fp32", lr=1e-3, micro_batch_tokens=64), tiny_model_spec)
    samples = _samples()
    for i, (s, lp) in enumerate(zip(samples, learner.logprobs(samples), strict=True)):
        off, v = (0.1, 3) if i % 2 == 0 else (-0.5, 1)
        s.logprobs = [x + off if m else 0.0 for x, m in zip(lp, s.loss_mask, strict=True)]
        s.versions = [v] * len(s)
    fresh = sum(s.num_loss_tokens for s in samples[::2])
    stale = sum(s.num_loss_tokens for s in samples[1::2])
    stats = learner.train_step(samples, version=3)
    assert stats["train/policy_tokens"] == fresh + stale and stats["train/fresh_tokens"] == fresh
    assert stats["train/logp_mismatch"] == pytest.approx((0.1 * fresh + 0.5 * stale) / (fresh + stale), abs=1e-4)
    assert stats["train/logp_mismatch_fresh"] == pytest.approx(0.1, abs=1e-4)  # the stale tokens are left out
    later = learner.train_step(samples, version=4)                 # nothing was sampled at version 4
    assert later["train/fresh_tokens"] == 0 and later["train/logp_mismatch_fresh"] == 0.0


def _grads(spec: str, samples: list[Sample], budget: int) -> list[torch.Tensor]:
    """The gradient of one on-policy step (the learner's .grad after it; no clipping)."""
    learner = Learner(TrainConfig(precision="fp32", lr=1e-3, grad_clip=0, micro_batch_tokens=budget), spec)
    for s, lp in zip(samples, learner.logprobs(samples), strict=True):
        s.logprobs = lp
    learner.train_step(samples, version=0)
    return [p.grad.clone() for p in learner.params if p.grad is not None]


def test_seq_mean_token_mean_weighs_every_episode_alike(tiny_model_spec):
    """train.loss_agg=seq-mean-token-mean: an episode of one short segment and one of two longer segments
    (trainer/batch.py gives each sample 1 / its episode's policy tokens). The step's gradient is the mean of
    the two episodes' own token-mean gradients, whatever the micro-batches, and not the token-mean's."""
    short, *long_segs = _samples(3, seed=4)
    short.token_ids, short.loss_mask = short.token_ids[:14], short.loss_mask[:14]
    short.logprobs, short.versions = short.logprobs[:14], short.versions[:14]
    short.advantage, long_segs[0].advantage, long_segs[1].advantage = 1.0, -1.0, -1.0
    episode_tokens = sum(s.num_loss_tokens for s in long_segs)
    assert short.num_loss_tokens * 3 < episode_tokens
    g_short = _grads(tiny_model_spec, [short], 4096)
    g_long = _grads(tiny_model_spec, long_segs, 4096)
    g_token_mean = _grads(tiny_model_spec, [short, *long_segs], 4096)
    short.loss_weight = 1.0 / short.num_loss_tokens
    for s in long_segs:
        s.loss_weight = 1.0 / episode_tokens
    for budget in (4096, 48):  # one micro-batch, or one per sample
        g_seq = _grads(tiny_model_spec, [short, *long_segs], budget)
        for a, b, t in zip(g_seq, g_short, g_long, strict=True):
            assert torch.allclose(a, (b + t) / 2, atol=1e-5)  # fp32 sums; the gradients reach 0.3
    assert not all(torch.allclose(a, b, atol=1e-5) for a, b in zip(g_seq, g_token_mean, strict=True))


def test_no_signal_means_no_update(tiny_model_spec):
    learner = Learner(TrainConfig(precision="fp32", lr=1e-2), tiny_model_spec)
    w0 = {k: v.clone() for k, v in learner.trainable_state().items()}
    stats = learner.train_step([], version=0)
    assert stats["train/optimizer_steps"] == 0
    assert all(torch.equal(w0[k], v) for k, v in learner.trainable_state().items())


@pytest.mark.parametrize("prox", ["recompute", "loglinear"])
def test_several_minibatches(tiny_model_spec, prox):
    learner = Learner(TrainConfig(precision="fp32", lr=1e-3, minibatches=2, prox_logp=prox), tiny_model_spec)
    samples = _samples()
    for s, lp in zip(samples, learner.logprobs(samples), strict=True):
        s.logprobs, s.versions = lp, [0] * len(s)
    stats = learner.train_step(samples, version=0)
    assert stats["train/optimizer_steps"] == 2
    # the second minibatch sees weights one step newer than pi_prox, so some ratio moved off 1
    assert stats["train/approx_kl"] != 0.0


def test_lora_export_is_the_merged_model(tiny_model_spec):
    from serving.models import load_model

    learner = Learner(TrainConfig(precision="fp32", lr=5e-2, lora_rank=4, lora_modules=["q_proj", "v_proj"]), tiny_model_spec)
    samples = _samples()
    learner.train_step(samples, version=0)
    exported = learner.export_weights()
    assert exported and all(".q_proj." in k or ".v_proj." in k for k in exported)
    plain = load_model(tiny_model_spec, dtype="float32")
    base_lp = _reference_logprobs(plain, samples[0])
    plain.load_state_dict(exported, strict=False)
    merged_lp = _reference_logprobs(plain, samples[0])
    assert learner.logprobs(samples[:1])[0] == pytest.approx(merged_lp, abs=2e-4)
    assert merged_lp != pytest.approx(base_lp, abs=1e-4)   # the adapters did change the policy


def test_checkpoint_state_round_trip(tiny_model_spec, tmp_path):
    cfg = TrainConfig(precision="fp32", lr=1e-2)
    a = Learner(cfg, tiny_model_spec)
    a.train_step(_samples(), version=0)
    b, old = Learner(cfg, tiny_model_spec), Learner(cfg, tiny_model_spec)
    learner_state.save(a, tmp_path)                     # the path a checkpoint takes: DCP shards + JSON
    assert not list(tmp_path.rglob(".metadata")) and (tmp_path / "learner" / ".metadata.json").exists()
    learner_state.load(b, tmp_path)                     # nothing unpickled on resume
    (tmp_path / "v1").mkdir()                           # a checkpoint of an earlier hexsearch still resumes
    torch.save({"params": a.trainable_state(), "optimizer": a.optimizer.state_dict(),
                "scheduler": a.scheduler.state_dict(), "torch_rng": torch.get_rng_state()}, tmp_path / "v1" / "learner.pt")
    learner_state.load(old, tmp_path / "v1")
    a.train_step(_samples(seed=1), version=1)
    for other in (b, old):
        other.train_step(_samples(seed=1), version=1)  # same optimizer moments -> same next step
        for k, v in a.trainable_state().items():
            assert torch.allclose(v, other.trainable_state()[k], atol=1e-6)


def test_split_by_tokens_balances():
    shares = split_by_tokens(_samples(9), 2)
    loads = [sum(len(s) for s in sh) for sh in shares]
    assert sum(len(sh) for sh in shares) == 9 and abs(loads[0] - loads[1]) <= 40


def test_entropy_bonus_raises_policy_entropy(tiny_model_spec):
    """With every advantage 0 only the bonus moves the weights: entropy rises under it and nothing moves without it."""
    samples = _samples()
    for s in samples:
        s.advantage = 0.0
    plain = Learner(TrainConfig(precision="fp32", lr=1e-2, entropy_coef=0.0), tiny_model_spec)
    w0 = {k: v.clone() for k, v in plain.trainable_state().items()}
    plain.train_step(samples, version=0)
    assert all(torch.equal(w0[k], v) for k, v in plain.trainable_state().items())
    bonus = Learner(TrainConfig(precision="fp32", lr=1e-3, entropy_coef=1.0), tiny_model_spec)
    seen = [bonus.train_step(samples, version=v)["train/entropy"] for v in range(3)]  # each at pre-step weights
    assert seen[0] < seen[1] < seen[2]


def test_samples_drawn_at_any_temperature_score_as_on_policy(tiny_model_spec):
    """Engines report log_softmax of the raw logits at every temperature (serving.protocol), and the
    learner scores the same raw policy: fresh tokens drawn at T=0.3 get behaviour weight 1, not q_T/p."""
    import asyncio

    from serving.engines.embedded import EmbeddedEngine
    from serving.protocol import GenerateRequest, SamplingParams

    prompt = list(range(10, 30))

    async def draw():
        engine = EmbeddedEngine(tiny_model_spec, dtype="float32")
        try:
            return await asyncio.gather(*(engine.generate(GenerateRequest(prompt, SamplingParams(
                max_new_tokens=12, temperature=0.3, seed=s, ignore_eos=True))) for s in range(4)))
        finally:
            engine.close()

    outs = asyncio.run(draw())
    samples = [Sample(prompt + o.output_ids, [0] * len(prompt) + [1] * len(o.output_ids),
                      [0.0] * len(prompt) + o.logprobs, [0] * (len(prompt) + len(o.output_ids)),
                      advantage=1.0 if i % 2 else -1.0) for i, o in enumerate(outs)]
    stats = Learner(TrainConfig(precision="fp32", lr=1e-3), tiny_model_spec).train_step(samples, version=0)
    assert stats["train/behav_weight_mean"] == pytest.approx(1.0, abs=1e-3)
    assert stats["train/behav_weight_max"] < 1.01 and stats["train/behav_weight_min"] > 0.99


def test_precision_sets_the_autocast(tiny_model_spec):
    import torch

    from serving.models import default_dtype

    fast = default_dtype("cpu")
    assert Learner(TrainConfig(), tiny_model_spec).autocast == (None if fast == torch.float32 else fast)
    assert Learner(TrainConfig(precision="bf16"), tiny_model_spec).autocast == torch.bfloat16
    assert Learner(TrainConfig(precision="fp32"), tiny_model_spec).autocast is None
