"""The native CPU decode attention (serving/engines/cpu_attention.py) against PyTorch's SDPA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from serving.engines import cpu_attention


@pytest.fixture()
def fresh_state(monkeypatch):
    """Forget the loaded kernel for one test (restored afterwards)."""
    monkeypatch.setattr(cpu_attention, "_lib", None)
    monkeypatch.setattr(cpu_attention, "_status", "not built")


def sdpa_reference(q, k, v, lengths, scale):
    """SDPA over the same slots with the engine's mask (slot < length), grouped heads packed."""
    batch, heads, _, dim = q.shape
    kv_heads = k.shape[1]
    mask = (torch.arange(k.shape[2])[None, :] < lengths[:, None])[:, None, None, :]
    out = F.scaled_dot_product_attention(q.reshape(batch, kv_heads, heads // kv_heads, dim).float(), k.float(),
                                         v.float(), attn_mask=mask, scale=scale)
    return out.reshape(batch, heads, 1, dim)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("kv_heads", "groups", "dim"), [(3, 3, 64), (2, 1, 64), (2, 2, 16), (1, 4, 32)])
def test_kernel_equals_sdpa_on_strided_slot_views(dtype, kv_heads, groups, dim):
    assert cpu_attention.load() is not None, cpu_attention.status()
    gen = torch.Generator().manual_seed(kv_heads * 100 + groups * 10 + dim)
    rows, capacity = 7, 96
    # the slot cache's layout: [rows, kv_heads, capacity, dim], viewed up to the longest row
    k_buf = torch.randn(rows + 2, kv_heads, capacity, dim, generator=gen).to(dtype)
    v_buf = torch.randn(rows + 2, kv_heads, capacity, dim, generator=gen).to(dtype)
    lengths = torch.tensor([1, 5, 17, 33, 64, 70, 3])
    longest = int(lengths.max())
    k, v = k_buf[1:rows + 1, :, :longest], v_buf[1:rows + 1, :, :longest]
    # queries as the model makes them: [rows, 1, heads, dim] transposed, so not contiguous
    q = torch.randn(rows, 1, kv_heads * groups, dim, generator=gen).to(dtype).transpose(1, 2)
    got = cpu_attention.decode_attention(q, k, v, lengths, dim ** -0.5)
    want = sdpa_reference(q, k, v, lengths, dim ** -0.5)
    assert got.shape == (rows, kv_heads * groups, 1, dim) and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(got.float(), want, atol=tol, rtol=tol), (got.float() - want).abs().max()
    # slots past a row's length are never read: poisoning them changes nothing
    k_buf[:, :, longest:] = float("nan")
    for r, n in enumerate(lengths.tolist()):
        k_buf[r + 1, :, n:] = float("nan")
        v_buf[r + 1, :, n:] = float("nan")
    again = cpu_attention.decode_attention(q, k, v, lengths, dim ** -0.5)
    assert torch.equal(again, got)


def test_lengths_outside_the_view_are_refused():
    assert cpu_attention.load() is not None, cpu_attention.status()
    q = torch.randn(2, 2, 1, 16)
    kv = torch.randn(2, 1, 8, 16)
    with pytest.raises(AssertionError, match="within the KV view"):
        cpu_attention.decode_attention(q, kv, kv, torch.tensor([3, 9]), 0.25)
    with pytest.raises(AssertionError, match="within the KV view"):
        cpu_attention.decode_attention(q, kv, kv, torch.tensor([0, 3]), 0.25)


def test_shapes_beyond_the_kernel_limits_stay_on_sdpa():
    """More grouped heads or a wider head than the C kernel holds: the attention function uses SDPA
    (an error from the kernel mid-generation would fail every running request)."""
    assert cpu_attention.load() is not None, cpu_attention.status()
    kv = torch.randn(2, 1, 8, 16)
    lengths = torch.tensor([8, 5])
    for heads, dim in ((cpu_attention.MAX_GROUPS + 1, 16), (2, cpu_attention.MAX_HEAD_DIM * 2)):
        q = torch.randn(2, heads, 1, dim)
        k = v = torch.randn(2, 1, 8, dim)
        assert not cpu_attention.supported(q, k, v)
        out, _ = cpu_attention.attention_forward(None, q, k, v, None, scaling=dim ** -0.5, hex_decode_lengths=lengths)
        assert out.shape == (2, 1, heads, dim)
    assert cpu_attention.supported(torch.randn(2, cpu_attention.MAX_GROUPS, 1, 16), kv, kv)


def test_installed_model_matches_sdpa_and_only_decoding_calls_use_the_kernel(monkeypatch):
    from serving.engines.kv import SlotKVCache
    from serving.models import load_model

    model = load_model("tiny-random", dtype="float32")
    reference = load_model("tiny-random", dtype="float32")
    assert cpu_attention.install(model) and model.config._attn_implementation == cpu_attention.NAME
    calls = []
    real = cpu_attention.decode_attention
    monkeypatch.setattr(cpu_attention, "decode_attention", lambda *a: calls.append(1) or real(*a))
    cfg = model.config
    heads = cfg.num_attention_heads
    rows, prompt = 3, 12
    ids = torch.randint(0, cfg.vocab_size, (rows, prompt + 1), generator=torch.Generator().manual_seed(0))
    logits = {}
    for name, m in (("native", model), ("sdpa", reference)):
        kv = SlotKVCache(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.hidden_size // heads, torch.float32)
        kv.ensure(rows, 64)
        pos = torch.arange(prompt)[None].expand(rows, prompt)
        with torch.inference_mode():
            kv.bind(0, rows, pos, prompt)
            m(input_ids=ids[:, :prompt], attention_mask=torch.ones(rows, 1, prompt, prompt).tril().bool(),
              position_ids=pos, cache=kv, use_cache=True)
            before = len(calls)
            step = torch.full((rows, 1), prompt)
            kv.bind(0, rows, step, prompt + 1)
            extra = {"hex_decode_lengths": step[:, 0] + 1} if name == "native" else {}
            out = m(input_ids=ids[:, prompt:], attention_mask=torch.ones(rows, 1, 1, prompt + 1, dtype=torch.bool),
                    position_ids=step, cache=kv, use_cache=True, **extra)
        logits[name] = out.logits
        if name == "native":
            assert before == 0, "the prefill pass stays on SDPA"
            assert len(calls) == cfg.num_hidden_layers, "every layer of the decoding step uses the kernel"
    assert torch.allclose(logits["native"], logits["sdpa"], atol=1e-4)


def test_switched_off_or_unbuildable_kernel_falls_back_to_sdpa(fresh_state, monkeypatch, tmp_path):
    monkeypatch.setenv("HEXSEARCH_NATIVE_ATTENTION", "0")
    assert cpu_attention.load() is None and "off" in cpu_attention.status()
    model = torch.nn.Linear(2, 2)
    assert cpu_attention.install(model) is False

    monkeypatch.setattr(cpu_attention, "_status", "not built")
    monkeypatch.delenv("HEXSEARCH_NATIVE_ATTENTION")
    monkeypatch.setenv("HEXSEARCH_CACHE", str(tmp_path))  # nothing built there yet
    monkeypatch.setenv("CC", "/bin/false")
    assert cpu_attention.load() is None
    assert cpu_attention.status().startswith("sdpa (native kernel unavailable") and "/bin/false" in cpu_attention.status()
    assert not list((tmp_path / "kernels").glob("*.so")), "a failed build leaves no library behind"


async def test_engine_reports_the_decode_attention_in_use(tokenizer):
    from serving.engines.embedded import EmbeddedEngine
    from serving.protocol import GenerateRequest, SamplingParams

    engine = EmbeddedEngine("tiny-random", tokenizer, dtype="float32")
    try:
        done = await engine.generate(GenerateRequest(tokenizer.encode("a b c"), SamplingParams(max_new_tokens=4,
                                                                                             ignore_eos=True)))
        assert len(done.output_ids) == 4
        assert (await engine.health())["decode_attention"].startswith("native")
    finally:
        await engine.aclose()
