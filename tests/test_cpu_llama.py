"""The fused CPU forward (serving/engines/cpu_llama.py) against the transformers forward it replaces."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from serving.engines import cpu_attention
from serving.engines.embedded_batch import BatchRunner, fused_forward
from serving.engines.embedded_weights import LoraState, apply_update

SMALL = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True)


def small_model(arch: str, dtype: torch.dtype, seed: int = 0):
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**SMALL)) if arch == "llama" else Qwen2ForCausalLM(Qwen2Config(**SMALL))
    return model.to(dtype).eval()


def runner(model, fused: bool, monkeypatch) -> BatchRunner:
    monkeypatch.setenv("HEXSEARCH_FUSED_FORWARD", "1" if fused else "0")
    r = BatchRunner(model, None, max_batch_size=8, max_model_len=256, prefill_chunk_tokens=64,
                    kv_cache_bytes=2**26, prefix_cache_bytes=0, seed=0, version=0)
    assert (r.fused is not None) == fused, r.forward_status
    return r


@torch.no_grad()
def engine_like_steps(r: BatchRunner) -> list[torch.Tensor]:
    """A left-padded prefill group (padding at slots after each row's data, as BatchRunner builds it), a
    second chunk continuing both rows, then three decoding steps; the last-column logits of each pass."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 300, (2, 7), generator=gen)
    pos = torch.tensor([[4, 5, 6, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6]])  # row 0: 4 tokens, 3 pads
    out = [r._forward(ids, pos, 1)]
    ids2 = torch.randint(3, 300, (2, 3), generator=gen)
    pos2 = torch.tensor([[4, 5, 6], [7, 8, 9]])  # row 0 overwrites its padding slots
    out.append(r._forward(ids2, pos2, 1))
    lengths = torch.tensor([7, 10])
    for _ in range(3):
        nxt = out[-1].argmax(-1)[:, None]
        out.append(r._forward(nxt, lengths[:, None].clone(), 1, decoding=True))
        lengths += 1
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_forward_equals_transformers_with_padding_chunks_and_decoding(arch, dtype, monkeypatch):
    model = small_model(arch, dtype)
    if arch == "qwen2":
        assert model.model.layers[0].self_attn.q_proj.bias is not None  # the fused q|k|v bias is exercised
    reference = runner(copy.deepcopy(model), False, monkeypatch)
    fused = runner(model, True, monkeypatch)
    want, got = engine_like_steps(reference), engine_like_steps(fused)
    tol = 1e-4 if dtype == torch.float32 else 0.05
    for w, g in zip(want, got, strict=True):
        scale = float(w.abs().max())
        assert float((w - g).abs().max()) <= tol * max(scale, 1.0), (float((w - g).abs().max()), scale)
    # the keys and values written into the slot cache agree too, slot for slot
    for row, n in ((1, 10), (2, 13)):
        a, b = reference.kv.kv[:, :, row, :, :n].float(), fused.kv.kv[:, :, row, :, :n].float()
        assert float((a - b).abs().max()) <= tol * max(float(a.abs().max()), 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weight_updates_reach_the_fused_projections(dtype, monkeypatch):
    model = small_model("llama", dtype)
    fused = runner(model, True, monkeypatch)
    assert fused.fused.pack == (dtype == torch.bfloat16)  # bf16 also serves decoding from packed copies
    before = engine_like_steps(fused)[0]
    gen = torch.Generator().manual_seed(5)
    update = {name: (torch.randn(p.shape, generator=gen) * 0.2).to(dtype) for name, p in model.named_parameters()
              if name.endswith(("k_proj.weight", "up_proj.weight", "down_proj.weight", "lm_head.weight"))
              or "layers.1.self_attn.q" in name}
    apply_update(model, update, LoraState(), None)  # copies in place, as EmbeddedEngine.update_weights does
    fused.epoch += 1  # as EmbeddedEngine._apply_weights does: the packed copies are rebuilt
    assert model.model.layers[0].self_attn.k_proj.weight.data_ptr() == fused.fused.layers[0][1].data_ptr() + (
        64 * 64 * model.dtype.itemsize)  # still a view into the fused q|k|v weight
    reference_model = small_model("llama", dtype)
    apply_update(reference_model, update, LoraState(), None)
    # the same runner again: its slots are rewritten from position 0, so nothing of the first pass is read
    want, got = engine_like_steps(runner(reference_model, False, monkeypatch)), engine_like_steps(fused)
    assert not torch.allclose(before, got[0], atol=1e-2)
    tol = 1e-4 if dtype == torch.float32 else 0.05
    for w, g in zip(want, got, strict=True):
        assert float((w - g).abs().max()) <= tol * max(float(w.abs().max()), 1.0)


def test_models_the_fused_forward_does_not_cover_keep_the_transformers_forward(monkeypatch):
    gelu = LlamaForCausalLM(LlamaConfig(**{**SMALL, "hidden_act": "gelu"})).eval()
    fused, status = fused_forward(gelu)
    assert fused is None and status == "transformers (the MLP is not a bias-free SiLU gate)"
    monkeypatch.setenv("HEXSEARCH_FUSED_FORWARD", "0")
    assert fused_forward(small_model("llama", torch.float32)) == (None, "transformers (HEXSEARCH_FUSED_FORWARD=0)")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernels_equal_the_transformers_modules(dtype):
    lib = cpu_attention.load()
    assert lib is not None, cpu_attention.status()
    gen = torch.Generator().manual_seed(3)
    bf16 = int(dtype == torch.bfloat16)
    # residual add + RMSNorm
    norm = LlamaRMSNorm(96, eps=1e-5).to(dtype)
    norm.weight.data = (torch.rand(96, generator=gen) + 0.5).to(dtype)
    x, residual = (torch.randn(40, 96, generator=gen) * 3).to(dtype), torch.randn(40, 96, generator=gen).to(dtype)
    want_residual = residual + x
    want = norm(want_residual)
    out = torch.empty_like(residual)
    assert lib.hex_add_rmsnorm(x.data_ptr(), residual.data_ptr(), norm.weight.data_ptr(), out.data_ptr(), 40, 96,
                               1e-5, 1, bf16, 2) == 0
    assert torch.equal(residual, want_residual)
    if dtype == torch.bfloat16:  # rounded where torch rounds: equal but for the sum-of-squares order
        assert (out != want).float().mean() < 1e-3 and torch.allclose(out.float(), want.float(), rtol=1e-2)
    else:
        assert torch.allclose(out, want, atol=1e-5, rtol=1e-5)
    # rotary embedding of q (in place) and k, and k/v written to their (row, head, slot)
    rot = LlamaRotaryEmbedding(LlamaConfig(**SMALL))
    hq, hk, d, n_rows, width = 4, 2, 16, 2, 5
    pos = torch.tensor([[0, 1, 2, 3, 4], [37, 38, 39, 40, 41]])
    qkv = torch.randn(n_rows * width, (hq + 2 * hk) * d, generator=gen).to(dtype)
    cos, sin = rot(qkv, pos)
    view = qkv.view(n_rows, width, hq + 2 * hk, d).transpose(1, 2)
    want_q, want_k = apply_rotary_pos_emb(view[:, :hq], view[:, hq:hq + hk], cos, sin)
    want_v = view[:, hq + hk:].clone()
    k_buf = torch.full((4, hk, 64, d), 7.0, dtype=dtype)
    v_buf = torch.full((4, hk, 64, d), 7.0, dtype=dtype)
    rows = torch.tensor([2] * width + [3] * width)
    slots = pos.reshape(-1).contiguous()
    c, s = cos.reshape(-1, d).contiguous(), sin.reshape(-1, d).contiguous()
    assert lib.hex_rope_store(qkv.data_ptr(), qkv.stride(0), c.data_ptr(), s.data_ptr(), k_buf.data_ptr(),
                              v_buf.data_ptr(), k_buf.stride(0), k_buf.stride(1), k_buf.stride(2), rows.data_ptr(),
                              slots.data_ptr(), n_rows * width, hq, hk, d, bf16, 2) == 0
    tol = {"atol": 1e-6, "rtol": 1e-6} if dtype == torch.float32 else {"atol": 0, "rtol": 0}
    assert torch.allclose(view[:, :hq], want_q, **tol)
    for r in range(n_rows):
        assert torch.allclose(k_buf[2 + r][:, pos[r]], want_k[r], **tol)
        assert torch.equal(v_buf[2 + r][:, pos[r]], want_v[r])
    written = torch.zeros(4, 64, dtype=torch.bool)
    written[2, pos[0]] = written[3, pos[1]] = True
    assert bool((k_buf.transpose(1, 2)[~written] == 7.0).all()) and bool((v_buf.transpose(1, 2)[~written] == 7.0).all())


async def test_engine_reports_the_fused_forward(tokenizer):
    from serving.engines.embedded import EmbeddedEngine

    engine = EmbeddedEngine("tiny-random", tokenizer, dtype="float32")
    try:
        assert (await engine.health())["forward"] == "fused (serving/engines/cpu_llama.py)"
    finally:
        await engine.aclose()
