"""A fused CPU forward pass for Llama-family models in the embedded engine (Llama, SmolLM2, Qwen2).

The transformers forward runs ~50 small ops per decoder layer; at the embedded engine's batch shapes (64
rows of 576 features in a decoding step) dispatch and one pass over memory per op cost as much as the
matrix products. This forward runs the same computation as one chain per layer:

    residual += h;  x = rmsnorm(residual)                  hex_add_rmsnorm          (C)
    qkv = x @ [Wq; Wk; Wv]^T (+ bias)                      one GEMM
    rotate q, k by position; k, v -> slot KV cache         hex_rope_store           (C)
    a = attention(q, cache rows)                           decode kernel / SDPA
    h = a @ Wo^T
    residual += h;  x = rmsnorm(residual)                  hex_add_rmsnorm          (C)
    h = (silu(x @ Wg^T) * (x @ Wu^T)) @ Wd^T               one GEMM, two ops, one GEMM

with the C kernels of serving/engines/csrc/llama_ops.c, which round where PyTorch rounds, so bf16 outputs match
the transformers modules to within GEMM summation order (tests/test_cpu_llama.py). The projections that
share an input are fused by making q/k/v (and gate/up) *views* of one weight tensor: the model's own
parameters keep their names and shapes, and weight updates, which copy into them in place, update the
fused tensors too. Models with anything else (sliding windows, q/k norms, biased MLPs, other activations)
keep the transformers forward (`unsupported` says why).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from serving.engines import cpu_attention
from serving.engines.kv import SlotKVCache

ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
PACK_ROWS, PACKED_MAX_ROWS = 64, 256
"""The weights are packed for 64-row products and used packed up to 256 rows (prefill chunks of ~1,000
rows are faster with F.linear's own reorder)."""


def unsupported(model) -> str | None:
    """Why `model` cannot use the fused forward, or None if it can."""
    cfg = model.config
    name = type(model).__name__
    if name not in ARCHITECTURES:
        return f"{name} is not one of {', '.join(ARCHITECTURES)}"
    if next(model.parameters()).device.type != "cpu":
        return "not on the CPU"
    if next(model.parameters()).dtype not in (torch.bfloat16, torch.float32):
        return f"dtype {next(model.parameters()).dtype}"
    if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "mlp_bias", False):
        return "the MLP is not a bias-free SiLU gate"
    if getattr(cfg, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    if getattr(cfg, "use_sliding_window", False) or any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or []):
        return "sliding-window attention"
    layer = model.model.layers[0]
    if any(hasattr(layer.self_attn, n) for n in ("q_norm", "k_norm")) or layer.self_attn.o_proj.bias is not None:
        return "q/k norms or an output-projection bias"
    if (head := layer.self_attn.head_dim) % 2 or head > cpu_attention.MAX_HEAD_DIM:
        return f"head_dim {head}"
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    if heads % kv_heads or heads // kv_heads > cpu_attention.MAX_GROUPS:
        return f"{heads} query heads over {kv_heads} KV heads"
    if cpu_attention.load() is None:
        return cpu_attention.status()
    return None


def _fuse(linears: list[torch.nn.Linear], attr: str) -> torch.Tensor | None:
    """Concatenate the linears' `attr` tensors along dim 0 and make each one a view of the result."""
    parts = [getattr(m, attr) for m in linears]
    if parts[0] is None:
        return None
    fused = torch.cat([p.detach() for p in parts], dim=0).contiguous()
    row = 0
    for p in parts:
        p.data = fused[row: row + p.shape[0]]
        row += p.shape[0]
    return fused


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


class FusedLlama:
    """The fused forward of one model (see the module docstring). Owns no weights: it holds views."""

    def __init__(self, model):
        self.model = model
        self.lib = cpu_attention.load()
        inner = model.model
        attn = inner.layers[0].self_attn
        self.hq, self.hk = model.config.num_attention_heads, model.config.num_key_value_heads
        self.d, self.scale = attn.head_dim, attn.scaling
        self.bf16 = int(next(model.parameters()).dtype == torch.bfloat16)
        self.layers = []
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append((layer.input_layernorm, _fuse([a.q_proj, a.k_proj, a.v_proj], "weight"),
                                _fuse([a.q_proj, a.k_proj, a.v_proj], "bias"), a.o_proj.weight,
                                layer.post_attention_layernorm, _fuse([m.gate_proj, m.up_proj], "weight"),
                                m.down_proj.weight))
        self.embed, self.norm, self.rotary = inner.embed_tokens.weight, inner.norm, inner.rotary_emb
        self.head = model.lm_head.weight
        self.pack = bool(self.bf16) and os.environ.get("HEXSEARCH_PACKED_WEIGHTS", "1") != "0"
        self._packed: dict[int, torch.Tensor] = {}
        self._packed_epoch: int | None = None

    def _repack(self, epoch: int) -> None:
        """oneDNN's blocked copies of every projection and the output layer, for small batches (decoding).

        `F.linear` reorders a bf16 weight into oneDNN's blocked layout on every call; at decoding's 1-64 rows
        that costs as much as the product (a 64-row step of SmolLM2-135M: 121 -> 96 ms with the copies). The
        copies take the weights' memory again and are rebuilt when the engine's weight epoch changes.
        """
        self._packed_epoch = epoch
        if not self.pack:
            return
        try:
            for w in [t for layer in self.layers for t in (layer[1], layer[3], layer[5], layer[6])] + [self.head]:
                self._packed[w.data_ptr()] = torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS)
        except (RuntimeError, AttributeError):  # a torch build without oneDNN: plain F.linear throughout
            self.pack, self._packed = False, {}

    def _linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        packed = self._packed.get(w.data_ptr()) if x.shape[0] <= PACKED_MAX_ROWS else None
        if packed is None:
            return F.linear(x, w, b)
        return torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")

    def _add_norm(self, x: torch.Tensor, residual: torch.Tensor, norm, add: bool) -> torch.Tensor:
        out = torch.empty_like(residual)
        self.lib.hex_add_rmsnorm(_ptr(x), _ptr(residual), _ptr(norm.weight), _ptr(out), residual.shape[0],
                                 residual.shape[1], float(norm.variance_epsilon), int(add), self.bf16,
                                 torch.get_num_threads())
        return out

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, pos: torch.Tensor, kv: SlotKVCache, row0: int,
                decode_lengths: torch.Tensor | None, epoch: int = 0) -> torch.Tensor:
        """Rows [row0, row0+R) of the slot cache, tokens `ids` [R, T] at positions `pos` [R, T] (slot ==
        position); attention sees slots [0, max(pos)] of each row through the mask slot <= position, or,
        for a decoding step (T == 1), slots [0, decode_lengths[r]) through the native kernel. Returns the
        last column's logits [R, vocab] in fp32. The caller has sized the cache (`kv.ensure`); `epoch`
        changes whenever the weights do (the packed copies are rebuilt)."""
        if epoch != self._packed_epoch:
            self._repack(epoch)
        n_rows, width = ids.shape
        n = n_rows * width
        length = int(pos.max()) + 1
        threads = torch.get_num_threads()
        hq, hk, d = self.hq, self.hk, self.d
        h = F.embedding(ids.reshape(n), self.embed)
        residual = h.clone()
        cos, sin = (t.reshape(n, d).contiguous() for t in self.rotary(h, pos))
        rows = torch.arange(row0, row0 + n_rows, dtype=torch.int64).repeat_interleave(width)
        slots = pos.reshape(n).to(torch.int64).contiguous()
        mask = None if decode_lengths is not None else (
            torch.arange(length)[None, None, None, :] <= pos[:, None, :, None])
        for i, (norm1, w_qkv, b_qkv, w_o, norm2, w_gu, w_down) in enumerate(self.layers):
            x = self._add_norm(h, residual, norm1, add=i > 0)
            qkv = self._linear(x, w_qkv, b_qkv)
            k_buf, v_buf = kv.kv[0, i], kv.kv[1, i]
            self.lib.hex_rope_store(_ptr(qkv), qkv.stride(0), _ptr(cos), _ptr(sin), _ptr(k_buf), _ptr(v_buf),
                                    k_buf.stride(0), k_buf.stride(1), k_buf.stride(2), _ptr(rows), _ptr(slots),
                                    n, hq, hk, d, self.bf16, threads)
            q = qkv.view(n_rows, width, hq + 2 * hk, d)[:, :, :hq].transpose(1, 2)  # [R, hq, T, d]
            keys, values = k_buf[row0: row0 + n_rows, :, :length], v_buf[row0: row0 + n_rows, :, :length]
            if decode_lengths is not None:
                a = cpu_attention.decode_attention(q, keys, values, decode_lengths, self.scale)
            else:
                a = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale,
                                                   enable_gqa=hq != hk).transpose(1, 2)
            h = self._linear(a.reshape(n, hq * d), w_o)
            x = self._add_norm(h, residual, norm2, add=True)
            gu = self._linear(x, w_gu)
            inter = gu.shape[1] // 2
            h = self._linear(F.silu(gu[:, :inter]).mul_(gu[:, inter:]), w_down)
        last = torch.arange(width - 1, n, width)  # each row's last column
        x = self._add_norm(h[last].contiguous(), residual[last].contiguous(), self.norm, add=True)
        return self._linear(x, self.head).float()
