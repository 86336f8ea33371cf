"""The learner's causal SDPA (trainer/attention.py): no mask where the causal kernel is exact, and the same
hidden states, gradients and updates as transformers' masked SDPA."""

from __future__ import annotations

import random

import pytest
import torch

from trainer.attention import ATTN_IMPLEMENTATION, bottom_right_causal_mask
from trainer.config import TrainConfig
from trainer.learner import Learner
from trainer.packing import Sample


def test_mask_is_skipped_only_for_bottom_right_causal_with_right_padding():
    right = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    left = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]], dtype=torch.bool)
    # 4 queries after a 2-token cached prefix, right-padded rows: plain causal, no mask
    assert bottom_right_causal_mask(2, 4, 6, q_offset=2, attention_mask=right) is None
    assert bottom_right_causal_mask(2, 6, 6, q_offset=0, attention_mask=right) is None
    # left padding hides keys before a query: a real mask
    mask = bottom_right_causal_mask(2, 4, 6, q_offset=2, attention_mask=left)
    assert mask is not None and not bool(mask[1, 0, 0, 0]) and bool(mask[1, 0, 0, 2])
    # queries not at the end of the keys (a static cache's empty slots): a real mask
    assert bottom_right_causal_mask(2, 4, 6, q_offset=0, attention_mask=None) is not None


def _decoder_run(model, ids, mask, prefix: int):
    """Hidden states of the rows' own tokens after a cached prefix forward, and the gradients of their sum."""
    model.zero_grad(set_to_none=True)
    dec = model.get_decoder()
    rows, width = ids.shape
    head = dec(input_ids=ids[:1, :prefix], position_ids=torch.arange(prefix)[None], use_cache=True)
    cache = head.past_key_values
    cache.batch_repeat_interleave(rows)
    pos = torch.arange(width)[None].expand(rows, -1)
    tail = dec(input_ids=ids[:, prefix:], position_ids=pos[:, prefix:], attention_mask=mask, past_key_values=cache,
               use_cache=True).last_hidden_state
    real = mask[:, prefix:].bool()
    (tail[real] ** 2).sum().backward()
    return tail[real].detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_cached_prefix_and_right_padding_match_masked_sdpa(tiny_model_spec):
    from serving.models import load_model

    ours = load_model(tiny_model_spec, dtype="float32")
    ours.set_attn_implementation(ATTN_IMPLEMENTATION)
    plain = load_model(tiny_model_spec, dtype="float32")  # transformers' sdpa with a materialised mask
    rng = random.Random(0)
    ids = torch.tensor([[rng.randint(5, 4000) for _ in range(30)] for _ in range(3)])
    ids[1:, :10] = ids[0, :10]  # a shared 10-token prefix
    mask = torch.ones(3, 30, dtype=torch.long)
    mask[1, 24:] = 0
    mask[2, 17:] = 0
    h_ours, g_ours = _decoder_run(ours, ids, mask, prefix=10)
    h_plain, g_plain = _decoder_run(plain, ids, mask, prefix=10)
    assert torch.allclose(h_ours, h_plain, atol=1e-5)
    assert g_ours.keys() == g_plain.keys() and len(g_ours) > 10
    for name, g in g_plain.items():
        assert torch.allclose(g_ours[name], g, atol=1e-5, rtol=1e-4), name


def _grouped(seed: int = 1) -> list[Sample]:
    rng = random.Random(seed)
    system = [rng.randint(5, 4000) for _ in range(20)]
    out = []
    for q in range(2):
        question = [rng.randint(5, 4000) for _ in range(6)]
        for g in range(3):
            body = [rng.randint(5, 4000) for _ in range(rng.randint(8, 30))]
            ids = system + question + body
            mask = [0] * 26 + [1 if i % 3 else 0 for i in range(len(body))]
            out.append(Sample(ids, mask, [-2.0] * len(ids), [0] * len(ids), advantage=1.0 if (q + g) % 2 else -1.0))
    return out


@pytest.mark.parametrize("packing", ["pad", "concat"])
def test_learner_update_matches_masked_sdpa(tiny_model_spec, packing):
    """A whole step (stem, shared prefixes, padded rows) updates the weights as transformers' SDPA does."""
    cfg = TrainConfig(precision="fp32", lr=1e-2, micro_batch_tokens=120, packing=packing)
    ours, plain = Learner(cfg, tiny_model_spec), Learner(cfg, tiny_model_spec)
    assert ours.model.config._attn_implementation == ATTN_IMPLEMENTATION
    plain.model.set_attn_implementation("sdpa")
    samples = _grouped()
    a, b = ours.logprobs(samples), plain.logprobs(samples)
    for x, y in zip(a, b, strict=True):
        assert x == pytest.approx(y, abs=2e-5)
    ours.train_step(samples, version=0)
    plain.train_step(samples, version=0)
    if packing == "pad":
        assert ours.stem_tokens > 0  # the cached-prefix path ran
    want = plain.trainable_state()
    for k, v in ours.trainable_state().items():
        assert torch.allclose(v, want[k], atol=1e-5), k
