"""Parts of the embedded engine on their own: the batched sampler and the KV storage."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 5, 1.0), (1.0, 0, 0.8),
                                                     (1.3, 8, 0.9)])
def test_sampler_draws_from_the_tempered_truncated_distribution(temperature, top_k, top_p):
    """Empirical frequencies of 40k draws match softmax(z/T) restricted to top-k / top-p; log-probs are
    log_softmax(z) of the raw logits whatever T, k, p."""
    from serving.sampling import BatchParams, sample

    vocab, n = 3000, 1000  # 3000 is not a multiple of the 1024-token CDF blocks
    g = torch.Generator().manual_seed(0)
    z = torch.randn(vocab, generator=g) * 2
    z[:12] += torch.linspace(6, 3, 12)  # a few likely tokens, a long tail
    q = torch.softmax(z / temperature, -1)
    order = torch.argsort(q, descending=True)
    keep = torch.zeros(vocab, dtype=torch.bool)
    allowed = order[:top_k] if top_k else order
    mass = torch.cumsum(q[allowed], 0) / q[allowed].sum()
    keep[allowed[: int((mass - q[allowed] / q[allowed].sum() < top_p).sum())]] = True
    expected = torch.where(keep, q, 0.0)
    expected /= expected.sum()
    params = BatchParams.build([temperature] * n, [top_p] * n, [top_k] * n, [None] * n, 0)
    counts, reference = torch.zeros(vocab), torch.log_softmax(z, -1)
    for _ in range(10):
        step = sample(z.repeat(n, 1), params, g)
        tokens = torch.tensor(step.tokens)
        counts += torch.bincount(tokens, minlength=vocab).float()
        assert (torch.tensor(step.logprobs) - reference[tokens]).abs().max() < 1e-5
    assert counts[~keep].sum() == 0, "nothing outside top-k / top-p is ever drawn"
    freq, total = counts / counts.sum(), counts.sum().item()
    assert (freq - expected).abs().max() < 0.015
    by_mass = torch.argsort(expected, descending=True)  # 20 bins of equal expected mass: 4-sigma agreement
    bins = (torch.cumsum(expected[by_mass], 0) * 20).long().clamp(max=19)
    for b in bins.unique():
        m, f = expected[by_mass][bins == b].sum().item(), freq[by_mass][bins == b].sum().item()
        assert abs(f - m) < 4 * (m * (1 - m) / total) ** 0.5 + 1e-3, (b, m, f)


def test_sampler_greedy_and_per_row_seeds():
    from serving.sampling import BatchParams, sample

    z = torch.randn(3, 500, generator=torch.Generator().manual_seed(1))
    gens = [None, torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)]
    out = sample(z, BatchParams.build([0.0, 1.0, 1.0], [1.0] * 3, [0] * 3, gens, 2), torch.Generator())
    assert out.tokens[0] == int(z[0].argmax())
    solo = sample(z[1:2], BatchParams.build([1.0], [1.0], [0], [torch.Generator().manual_seed(5)], 0),
                  torch.Generator())
    assert out.tokens[1] == solo.tokens[0], "a seeded row draws the same whatever shares its batch"
    assert [t for t, _ in out.top[0]] == z[0].topk(2).indices.tolist()


def test_slot_kv_cache_growth_moves_and_prefix_lru():
    from serving.engines.kv import PrefixCache, PrefixEntry, SlotKVCache

    kv = SlotKVCache(n_layers=2, n_kv_heads=1, head_dim=4, dtype=torch.float32, length_multiple=8)
    kv.ensure(rows=3, length=5)
    assert kv.rows_capacity == 8 and kv.capacity == 8
    assert torch.count_nonzero(kv.kv) == 0, "never-written slots are zeros (masked reads must stay finite)"
    kv.kv[:, :, 2, :, :5] = 7.0
    kv.ensure(rows=9, length=20, length_hint=24)
    assert kv.rows_capacity == 16 and kv.capacity == 24 and bool((kv.kv[:, :, 2, :, :5] == 7).all())
    assert torch.count_nonzero(kv.kv[:, :, 2, :, 5:]) == 0
    kv.move_row(2, 0, 5)
    saved = kv.read_row(0, 5)
    assert saved.shape == (2, 2, 1, 5, 4) and bool((saved == 7).all())
    kv.write_row(1, saved[:, :, :, :3])
    assert bool((kv.kv[:, :, 1, :, :3] == 7).all()) and torch.count_nonzero(kv.kv[:, :, 1, :, 3:]) == 0

    cache = PrefixCache(max_bytes=3 * 4 * 10)  # room for 30 floats
    for rid in ("a", "b", "c"):
        cache.put(rid, PrefixEntry([1, 2, 3], torch.zeros(10)))
    cache.put("d", PrefixEntry([1, 2], torch.zeros(10)))
    assert len(cache) == 3 and cache.pop("a") is None, "least recently used goes first"
    n, entry = cache.take_match("b", [1, 2, 9, 9])
    assert n == 2 and entry.token_ids == [1, 2, 3], "the common prefix is reused"
    assert cache.take_match("b", [1, 2, 9, 9]) == (0, None), "an entry is taken once"
    n, entry = cache.take_match("c", [1, 2, 3])
    assert n == 2 and entry is not None, "one prompt token is always left to prefill"
    assert cache.take_match("d", [5, 6])[0] == 0 and cache.stats()["hits"] >= 1
