"""Memory per device of a learner rank and of an engine replica: the planner's memory model, term by term.

Symbols: P parameters, L layers, h hidden size, I MLP size, V vocabulary, T tokens of one micro-batch on a rank,
f the fraction of them that are policy tokens, c bytes of the compute dtype (2 for bf16, 4 for fp32), N ranks that
shard the state. Learner rank (hexsearch's learner, trainer/learner.py and trainer/strategy.py):

    state        16 P / N            fp32 weights, fp32 gradients, AdamW m and v (N = 1 under ddp: replicated)
    ddp buckets  4 P                 DistributedDataParallel's gradient buckets (ddp with 2+ ranks)
    gathered     c (E + 2 P_layer)   fsdp2: the root unit (embeddings, and lm_head when untied) and two decoder
                                     layers (current + prefetch) all-gathered in the compute dtype
    activations  L T h c + T a c     checkpointing: each layer's input kept, one layer's working set recomputed
                 L T a c             without: every layer's working set, a = 6 h + 4 I elements per token
    logits       3 f T V 4           fp32 [policy tokens x vocab] tensors alive at once in the backward of
                                     trainer/learner.py `_logp`: log_softmax's saved output, the gather's
                                     gradient and log_softmax's backward (the forward's peak, output and the
                                     entropy metric's exp and product, is also 3)
    runtime      R (CPU: 45 MiB)     what a process's first training step leaves resident besides the tensors:
                                     the code of the kernels it runs (libtorch's pages, 13 MiB) and the heap of
                                     the allocator's and autograd's small objects (16-22 MiB); measured after the
                                     steps, 37 MiB (tiny model) to 52 MiB (SmolLM2-135M). `runtime_bytes`: 0 for
                                     GPUs, where the CUDA context is the planner's `memory_fraction` headroom

Engine replica (tensor parallel t): weights P s / t, and the KV cache of the sequences it decodes at once,
b x context x kappa / t, with b the trajectories in flight per replica capped by its decode batch.
`benchmarks/learner_memory.py` measures the learner's peak on CPU against these terms.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from trainer.planner.specs import ModelSpec

GB = 1e9
CPU_RUNTIME_BYTES = 45 * 2**20
"""The `runtime` term of a CPU learner process (module docstring): kernel code and the heap a step leaves."""


@dataclass(frozen=True)
class LearnerMemory:
    """Bytes per learner device, by term (see the module docstring)."""

    state: float
    ddp_buckets: float
    gathered: float
    activations: float
    logits: float
    runtime: float = 0.0

    @property
    def total(self) -> float:
        return self.state + self.ddp_buckets + self.gathered + self.activations + self.logits + self.runtime

    def parts_gb(self) -> dict[str, float]:
        return {k: v / GB for k, v in asdict(self).items() if v or k != "runtime"}  # no runtime row on GPUs


def _embedding_params(m: ModelSpec) -> float:
    return m.vocab * m.hidden * (1 if m.tied_embeddings else 2)


def _layer_params(m: ModelSpec) -> float:
    return max(m.params_b * 1e9 - _embedding_params(m), 0.0) / max(m.layers, 1)


def activation_elements_per_token(m: ModelSpec) -> float:
    """a: one decoder layer's saved activations per token (norm inputs, q/k/v/o, gate, up, act, product)."""
    mlp = m.intermediate or 4 * m.hidden
    return 6 * m.hidden + 4 * mlp


def learner_memory(m: ModelSpec, *, strategy: str, ranks: int, micro_batch_tokens: float, checkpointing: bool,
                   policy_fraction: float = 1.0, compute_bytes: int = 2, tp: int = 1, pp: int = 1,
                   runtime_bytes: float = 0.0) -> LearnerMemory:
    """Bytes per device of one learner rank. `strategy`: `ddp` (state replicated) or `fsdp2` (sharded over
    `ranks`); `tp`/`pp` divide weights and activations for trainers with model parallelism (the planner's);
    `runtime_bytes`: the process's own runtime (CPU_RUNTIME_BYTES for a CPU learner)."""
    p = m.params_b * 1e9
    model_par = tp * pp
    sharded = strategy == "fsdp2" and ranks > 1
    state = 16 * p / (ranks * model_par if sharded else model_par)
    buckets = 4 * p / model_par if strategy == "ddp" and ranks > 1 else 0.0
    gathered = compute_bytes * (_embedding_params(m) + 2 * _layer_params(m)) / model_par if sharded else 0.0
    t, a = micro_batch_tokens, activation_elements_per_token(m) / tp
    layers = m.layers / pp
    act = (layers * t * m.hidden + t * a) * compute_bytes if checkpointing else layers * t * a * compute_bytes
    logits = 3 * policy_fraction * t * m.vocab * 4 / tp
    return LearnerMemory(state, buckets, gathered, act, logits, runtime_bytes)


def engine_memory_gb(m: ModelSpec, *, tp: int, sequences: float, context_tokens: float) -> dict[str, float]:
    """GB per engine GPU: the weights and the KV cache of `sequences` decoding at once with `context_tokens` each."""
    weights = m.params_b * 1e9 * m.bytes_per_param / tp
    kv = sequences * context_tokens * m.kv_bytes_per_token / tp
    return {"weights": weights / GB, "kv_cache": kv / GB}


def model_spec_from_hf(config: Any, params: float, name: str = "", bytes_per_param: float = 2.0) -> ModelSpec:
    """A ModelSpec from a transformers config and the model's parameter count."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return ModelSpec(name=name, params_b=params / 1e9, layers=config.num_hidden_layers, hidden=config.hidden_size,
                     kv_bytes_per_token=2 * config.num_hidden_layers * kv_heads * head_dim * bytes_per_param,
                     bytes_per_param=bytes_per_param, vocab=config.vocab_size,
                     intermediate=getattr(config, "intermediate_size", 0) or 0,
                     tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)))


def model_spec_of(model: str, bytes_per_param: float = 2.0) -> ModelSpec:
    """The ModelSpec of a model hexsearch can load (an alias or a local folder): its config and exact parameter
    count (the model built on the meta device, no weights read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from serving.models import resolve_model

    config = AutoConfig.from_pretrained(resolve_model(model))
    with torch.device("meta"):
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    return model_spec_from_hf(config, params, model, bytes_per_param)
