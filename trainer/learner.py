"""The learner: decoupled-PPO updates of the policy on packed micro-batches (pure torch, no Ray).

One `train_step(samples, version)` is one batch of the trainer:

    1. N = policy tokens of the whole batch (all-reduced over data-parallel ranks)
    2. pi_prox: with one minibatch the update's own forward runs at the pre-step weights, so
       pi_prox = logp.detach() there, exactly and for free; with several minibatches a no-grad
       forward recomputes it first (`prox_logp=recompute`) or it is approximated (`loglinear`)
    3. per minibatch: forward + backward per micro-batch (loss already divided by the global N,
       so summing gradients over micro-batches and ranks gives the exact token-mean), all-reduce
       gradients, clip, AdamW step
    4. LR schedule step (also when the batch had no signal, so the schedule follows versions)

`train_step(samples, version, objective="sft")` runs the same steps with the SFT loss instead
(trainer/loss.py `sft_loss`: token-mean NLL of the policy tokens; one minibatch, no pi_prox, no
entropy bonus): `hexsearch sft` trains through this learner, its strategies, LoRA and checkpoints.

Besides the loss terms, the metrics report how far the engine's behaviour log-probs are from the
learner's pi_prox: `train/logp_mismatch` = mean |log pi_prox - log pi_behav| over all policy tokens,
`train/logp_mismatch_fresh` the same over the `train/fresh_tokens` sampled at the learner's current
version (0 when there are none), where it is pure numerics (bf16 engines, kernels); with
`prox_logp=loglinear` fresh tokens get pi_prox = pi_behav, so that one reads 0 there.

Logits are computed only at positions that predict a policy token (hidden-state gather, then
lm_head), which on CPU saves most of the vocabulary projection. Attention is SDPA with its causal kernel also
for rows that continue a cached prefix or are right-padded (trainer/attention.py: no [q, k] mask, half the work). Weights are kept in fp32 (master
weights); on hardware with fast bf16 the forward runs under autocast (FSDP's mixed precision under fsdp2).
How the ranks hold the model and combine gradients (plain, DDP, FSDP2) is trainer/strategy.py; the
checkpoint format (torch.distributed.checkpoint shards, JSON metadata) is trainer/learner_state.py;
computing a shared prefix once (a group's question, a step's system prompt) is trainer/prefix_sharing.py.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import time
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from core.choices import check_choices
from trainer.attention import ATTN_IMPLEMENTATION
from trainer.config import TrainConfig
from trainer.loss import LossStats, decoupled_ppo_loss, loglinear_prox_logp, sft_loss
from trainer.packing import MicroBatch, Sample, collate, plan_micro_batches
from trainer.prefix_sharing import Stem, shared_prefix
from trainer.strategy import LearnerStrategy, PolicyForward


def lr_lambda(cfg: TrainConfig):
    """Multiplier of the base LR at step s: linear warm-up, then constant or cosine to 10%."""
    def f(step: int) -> float:
        if cfg.lr_warmup_steps and step < cfg.lr_warmup_steps:
            return (step + 1) / cfg.lr_warmup_steps
        if cfg.lr_schedule == "cosine":
            span = max(1, cfg.steps - cfg.lr_warmup_steps)
            frac = min(1.0, (step - cfg.lr_warmup_steps) / span)
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))
        return 1.0
    return f


class Learner:
    """Holds the trainable policy, its optimizer and LR schedule."""

    def __init__(self, cfg: TrainConfig, model_spec: str, *, device: str = "cpu",
                 rank: int = 0, world_size: int = 1, seed: int = 0):
        from serving.models import default_dtype, load_model, load_tokenizer

        check_choices(cfg, "train")
        torch.manual_seed(seed)
        self.cfg, self.device = cfg, device
        self.rank, self.world_size, self.model_spec = rank, world_size, model_spec
        self.tokenizer = load_tokenizer(model_spec)
        model = load_model(model_spec, dtype="float32", device=device, attn_implementation="sdpa")
        model.set_attn_implementation(ATTN_IMPLEMENTATION)  # causal kernel for cached prefixes and right padding
        self.tied = bool(getattr(model.config, "tie_word_embeddings", False))
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.config.use_cache = False
        if cfg.lora_rank > 0:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(
                r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0, target_modules=list(cfg.lora_modules)))
        self.model = model.eval()  # no dropout in RL updates; grads flow regardless of mode
        self.base = model.get_base_model() if cfg.lora_rank > 0 else model
        fast = {"auto": default_dtype(device), "fp32": torch.float32, "bf16": torch.bfloat16}[cfg.precision]
        self.strategy = LearnerStrategy(cfg.learner, world_size, device, bf16=fast == torch.bfloat16,
                                        decoder_layers=self.base.get_decoder().layers)
        if self.strategy.sharded and cfg.lora_rank > 0:
            raise ValueError("train.learner.strategy=fsdp2 shards full fine-tuning; LoRA runs (train.lora_rank > 0) "
                             "train few weights: use train.learner.strategy=ddp")
        self.autocast = fast if fast != torch.float32 and not self.strategy.mixed_precision else None
        self.strategy.wrap(PolicyForward(self.model, self._hidden, self.base.get_output_embeddings))
        self.params = [p for p in self.model.parameters() if p.requires_grad]  # sharded ones under fsdp2
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, betas=tuple(cfg.adam_betas),
                                           weight_decay=cfg.weight_decay, fused=not self.strategy.sharded)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg))
        if cfg.gradient_checkpointing:
            self.model.train()  # HF checkpoints only in train mode (Llama-family models have no dropout)
        # prefix sharing needs a KV cache, which gradient checkpointing turns off; under fsdp2 a second
        # decoder forward per micro-batch would be a second round of all-gathers on some ranks only
        self.share_prefix = (cfg.share_prefix and cfg.packing == "pad" and not cfg.gradient_checkpointing
                             and not self.strategy.sharded)
        params = inspect.signature(self.base.get_decoder().forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.stem_tokens = 0
        """Prompt tokens whose forward and backward the step-wide stem saved, over the run."""

    # -- forward ---------------------------------------------------------------------------
    def _autocast(self):
        """bf16 autocast under `train.precision` (`auto`: where the device runs it fast), else a no-op."""
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.split(":")[0], dtype=self.autocast)

    def _logp(self, mb: MicroBatch, with_entropy: bool = False,
              stem: Stem | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs of the policy tokens of a micro-batch (and their entropies)."""
        dev = self.device
        offset = 0 if stem is None else stem.length
        mask = None if mb.attention_mask is None else mb.attention_mask.to(dev)
        with self._autocast():
            logits = self.strategy.forward(mb.input_ids.to(dev), mb.position_ids.to(dev), mask,
                                           mb.rows.to(dev), mb.pos.to(dev) - offset, stem)
        # raw logits, whatever the sampling temperature: engines report log_softmax(z) (serving.protocol),
        # so pi_theta, pi_prox and pi_behav are the same function and w = 1 for fresh tokens
        # log_softmax, not logits - logsumexp(logits): its backward keeps one vocabulary-wide tensor (its output)
        # and makes one, where logsumexp's kept the logits and made three at once (x - lse, its exp, the product);
        # with the gather's gradient that is 3 instead of 5 fp32 [policy tokens x vocab] tensors at the peak
        # (trainer/planner/memory.py, measured by benchmarks/learner_memory.py)
        logsm = torch.log_softmax(logits.float(), dim=-1)
        del logits
        logp = logsm.gather(-1, mb.targets.to(dev)[:, None]).squeeze(-1)
        entropy = None
        if with_entropy:  # with gradients only when the loss has an entropy bonus
            with torch.set_grad_enabled(torch.is_grad_enabled() and self.cfg.entropy_coef > 0):
                entropy = -(logsm.exp() * logsm).sum(-1)
        return logp, entropy

    def _hidden(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None,
                stem: Stem | None = None) -> torch.Tensor:
        """Final hidden states [rows, length - stem.length, dim] (columns from the end of the stem on).

        Rows that start with the same tokens (a group's question) share one forward of that prefix:
        its keys/values are computed once and repeated per row (gradients flow back through the
        repeat), then each row runs only its own suffix. A step-wide `stem` (the system prompt) was
        computed once for all micro-batches; its keys/values start every row's cache. Exactly the same
        values as the full forward, for a fraction of the compute."""
        dec = self.base.get_decoder()
        rows, start = ids.shape[0], 0 if stem is None else stem.length
        cache = None if stem is None else stem.cache()
        shared = shared_prefix(ids, mask) if self.share_prefix else 0
        parts = []
        if shared - start >= 16:
            head = dec(input_ids=ids[:1, start:shared], position_ids=pos[:1, start:shared], use_cache=True,
                       **({} if cache is None else {self._cache_kw: cache}))
            cache = getattr(head, "cache", None) or head.past_key_values
            parts.append(head.last_hidden_state.expand(rows, -1, -1))
            start = shared
        if cache is None:
            return dec(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=False).last_hidden_state
        cache.batch_repeat_interleave(rows)
        tail = dec(input_ids=ids[:, start:], position_ids=pos[:, start:], attention_mask=mask,
                   **{self._cache_kw: cache}, use_cache=True)
        return torch.cat([*parts, tail.last_hidden_state], dim=1)

    def _stem(self, samples: list[Sample], micro_batches: int) -> Stem | None:
        """The prefix all samples of a step share, up to their first trained position (the system
        prompt and worked examples): one forward, reused by every micro-batch (see `Stem`)."""
        if not self.share_prefix or micro_batches < 2 or self.strategy.lockstep:
            return None  # with several ranks its own backward would come after the gradient reduction
        first = samples[0].token_ids
        n = len(os.path.commonprefix([s.token_ids for s in samples]))  # works on any sequences
        n = min([n] + [s.loss_mask.index(1) - 1 for s in samples if 1 in s.loss_mask])
        if n < 16:
            return None
        dev = self.device
        with self._autocast():
            out = self.base.get_decoder()(input_ids=torch.tensor([first[:n]], device=dev),
                                          position_ids=torch.arange(n, device=dev)[None, :], use_cache=True)
        cache = getattr(out, "cache", None) or out.past_key_values
        return Stem(n, [(layer.keys, layer.values) for layer in cache.layers])

    def _allreduce(self, t: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            dist.all_reduce(t)
        return t

    def _lockstep(self, samples: list[Sample], plan: list[list[int]], pad_id: int) -> Any:
        """(is_last, micro-batch or None) over the plan's micro-batches that have policy tokens. Under
        `strategy.lockstep` every rank yields as many as the rank with the most: None stands for a zero-loss
        dummy forward (and backward), which keeps the ranks' collectives in step."""
        batches = [mb for mb in (collate(samples, idx, self.cfg.packing, pad_id) for idx in plan) if mb.targets.numel()]
        n = self.strategy.lockstep_count(len(batches))
        for i in range(n):
            yield i == n - 1, batches[i] if i < len(batches) else None

    def _dummy(self) -> MicroBatch:
        pad_id = self.tokenizer.pad_token_id or 0
        return collate([Sample([pad_id, pad_id], [0, 1], [0.0, 0.0], [0, 0], 0.0)], [0], self.cfg.packing, pad_id)

    # -- one batch ---------------------------------------------------------------------------
    def train_step(self, samples: list[Sample], version: int, objective: str = "ppo") -> dict[str, Any]:
        """One training batch (this rank's share); returns metrics (identical on every rank). `objective`:
        `ppo` (decoupled PPO) or `sft` (token-mean NLL of the policy tokens, trainer/loss.py)."""
        if objective not in ("ppo", "sft"):
            raise ValueError(f"unknown learner objective {objective!r}: ppo or sft")
        cfg, t0, sft = self.cfg, time.time(), objective == "sft"
        m = 1 if sft else max(1, cfg.minibatches)
        chunks = [samples[i::m] for i in range(m)]
        pad_id = self.tokenizer.pad_token_id or 0
        if m > 1 and cfg.prox_logp == "recompute":
            self._recompute_prox(samples, pad_id)
        stats, ent_sum, grad_norm, tokens_seen, steps = LossStats(), 0.0, 0.0, 0, 0
        for chunk in chunks:
            # N: the batch's summed token weights (its policy tokens under token-mean; trainer/loss.py)
            local = torch.tensor([float(sum(s.loss_weight * s.num_loss_tokens for s in chunk))], device=self.device)
            total = float(self._allreduce(local)[0])
            self.optimizer.zero_grad(set_to_none=True)
            if total == 0:
                continue
            plan = self._plan(chunk)
            stem = self._stem(chunk, len(plan))
            for last, mb in self._lockstep(chunk, plan, pad_id):
                with self.strategy.backward_sync(last):
                    if mb is None:
                        (self._logp(self._dummy())[0].sum() * 0.0).backward()
                        continue
                    logp, ent = self._logp(mb, with_entropy=True, stem=stem)
                    if sft:
                        loss, st = sft_loss(logp, normalizer=total)
                    else:
                        prox = self._prox_for(mb, logp, version, m)
                        loss, st = decoupled_ppo_loss(
                            logp, prox, mb.behav_logp.to(self.device), mb.advantages.to(self.device),
                            eps_clip=cfg.eps_clip, eps_clip_high=cfg.eps_clip_high,
                            behav_weight_cap=cfg.behav_weight_cap, normalizer=total,
                            fresh=mb.versions.to(self.device) == version, token_weight=mb.token_weights.to(self.device))
                    if cfg.entropy_coef > 0 and not sft:
                        loss = loss - cfg.entropy_coef * (ent * mb.token_weights.to(self.device)).sum() / total
                    loss.backward()
                stats = stats.add(st)
                ent_sum += float(ent.detach().sum())
                tokens_seen += mb.num_tokens
            if stem is not None:
                stem.backward()
                self.stem_tokens += stem.length * (len(plan) - 1)
            if cfg.grad_clip > 0:
                grad_norm = self.strategy.clip(self.params, cfg.grad_clip)
            self.optimizer.step()
            steps += 1
        lr = self.scheduler.get_last_lr()[0]
        with warnings.catch_warnings():  # a batch without signal steps the schedule but not the optimizer
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()
        vec = torch.tensor([stats.tokens, stats.clipped, stats.behav_masked, stats.behav_weight_sum,
                            stats.approx_kl_sum, ent_sum, float(tokens_seen), stats.logp_mismatch_sum,
                            stats.fresh_tokens, stats.fresh_logp_mismatch_sum, stats.nll_sum], device=self.device)
        vec = self._allreduce(vec).tolist()
        wext = torch.tensor([stats.behav_weight_max, -stats.behav_weight_min if stats.tokens else 0.0])
        if self.world_size > 1:
            dist.all_reduce(wext, op=dist.ReduceOp.MAX)
        n = max(vec[0], 1.0)
        dt = time.time() - t0
        return {
            "train/policy_tokens": vec[0], "train/clip_frac": vec[1] / n, "train/behav_weight_masked_frac": vec[2] / n,
            "train/behav_weight_mean": vec[3] / n, "train/behav_weight_max": float(wext[0]),
            "train/behav_weight_min": -float(wext[1]),
            "train/approx_kl": vec[4] / n, "train/entropy": vec[5] / n, "train/grad_norm": grad_norm,
            "train/logp_mismatch": vec[7] / n, "train/fresh_tokens": vec[8],
            "train/logp_mismatch_fresh": vec[9] / max(vec[8], 1.0), "train/nll": vec[10] / n,
            "train/lr": lr, "train/optimizer_steps": steps, "train/tokens_per_s": vec[6] / max(dt, 1e-9),
            "time/train_s": dt,
        }

    def _prox_for(self, mb: MicroBatch, logp: torch.Tensor, version: int, minibatches: int) -> torch.Tensor:
        if self.cfg.prox_logp == "loglinear":
            return loglinear_prox_logp(mb.behav_logp.to(self.device), logp, mb.versions.to(self.device), version)
        if minibatches == 1:
            return logp.detach()  # this forward runs at the pre-step weights: exactly pi_prox
        assert mb.prox_logp is not None
        return mb.prox_logp.to(self.device)

    def _plan(self, samples: list[Sample]) -> list[list[int]]:
        """Micro-batches; with prefix sharing, samples sorted by their tokens so shared prompts sit together."""
        order = sorted(range(len(samples)), key=lambda i: samples[i].token_ids) if self.share_prefix else None
        return plan_micro_batches([len(s) for s in samples], self.cfg.micro_batch_tokens, self.cfg.packing, order)

    @torch.no_grad()
    def _recompute_prox(self, samples: list[Sample], pad_id: int) -> None:
        for s in samples:
            s.prox_logp = [0.0] * len(s)
        for _, mb in self._lockstep(samples, self._plan(samples), pad_id):
            logp, _ = self._logp(mb or self._dummy())
            if mb is None:
                continue
            for lp, si, t in zip(logp.tolist(), mb.sample_index.tolist(), mb.token_index.tolist(), strict=True):
                samples[si].prox_logp[t] = lp

    @torch.no_grad()
    def logprobs(self, samples: list[Sample]) -> list[list[float]]:
        """Current-policy log-prob of every token (0.0 where not a policy token); for tests and checks."""
        pad_id = self.tokenizer.pad_token_id or 0
        out = [[0.0] * len(s) for s in samples]
        for _, mb in self._lockstep(samples, self._plan(samples), pad_id):
            logp, _ = self._logp(mb or self._dummy())
            if mb is None:
                continue
            for lp, si, t in zip(logp.tolist(), mb.sample_index.tolist(), mb.token_index.tolist(), strict=True):
                out[si][t] = lp
        return out

    # -- weights out -------------------------------------------------------------------------
    @torch.no_grad()
    def export_weights(self, dtype: torch.dtype | None = None, changed_only: bool = True) -> dict[str, torch.Tensor]:
        """Weights for the inference engines, named as in the plain HF model (LoRA merged in), on the CPU. `changed_only`
        leaves out frozen base weights under LoRA (an in-memory update moves only what moved); a tied head once."""
        return {k: v.cpu().clone() for k, v in self.engine_weights(dtype, changed_only) if v is not None}

    def _engine_entries(self, changed_only: bool, untie: bool) -> list[tuple[str, torch.Tensor, Any]]:
        """(HF name, the tensor or base weight, the LoRA layer to merge or None), without gathering anything."""
        if self.cfg.lora_rank == 0:
            entries = [(k, v, None) for k, v in self.model.state_dict().items()]
        else:
            from peft.tuners.lora import LoraLayer

            lora = {f"{n}.weight": m for n, m in self.base.named_modules() if isinstance(m, LoraLayer)}
            entries = ([(k, m.get_base_layer().weight, m) for k, m in lora.items()] if changed_only else
                       [(k, v, lora.get(k)) for k, v in ((k.replace(".base_layer", ""), v)
                                                         for k, v in self.base.state_dict().items() if "lora_" not in k)])
        if self.tied:
            entries = [e for e in entries if e[0] != "lm_head.weight"]
            if untie:  # servers serve an untied copy: its head is the embedding, sent explicitly
                entries.append(("lm_head.weight", self.base.get_input_embeddings().weight, None))
        return entries

    def engine_weight_meta(self, dtype: torch.dtype | None = None, untie: bool = False) -> list[tuple[str, Any, tuple]]:
        """(name, dtype, full shape) of what `engine_weights(dtype, changed_only=False, untie=untie)` yields."""
        return [(k, dtype or v.dtype, tuple(v.shape)) for k, v, _ in self._engine_entries(False, untie)]

    @torch.no_grad()
    def engine_weights(self, dtype: torch.dtype | None = None, changed_only: bool = True, untie: bool = False,
                       device: str | None = None) -> Iterator[tuple[str, torch.Tensor | None]]:
        """The weights for the engines one tensor at a time (fsdp2: an all-gather each, which every rank runs;
        ranks other than 0 get None). `untie`: a tied lm_head is sent as a copy of the embeddings."""
        for k, v, layer in self._engine_entries(changed_only, untie):
            w = self.strategy.full(v if layer is None else layer.get_base_layer().weight + layer.get_delta_weight("default"))
            keep = self.rank == 0 or not self.strategy.sharded  # the other fsdp2 ranks only took part in the gather
            yield k, w.detach().to(device=device, dtype=dtype or w.dtype).contiguous() if keep else None

    def save_for_engine(self, path: str, adapter: bool = False) -> str:
        """An HF folder with the merged weights and an untied lm_head (what remote engines reload), or with
        `adapter` only the LoRA adapter (PEFT's adapter files, serving/remote/weight_transfer.py)."""
        from serving.models import save_untied

        if adapter:
            if self.rank == 0:
                self.model.save_pretrained(path)
            return path

        if self.cfg.lora_rank == 0 and not self.strategy.sharded:
            return str(save_untied(self.model, self.tokenizer, path))
        from serving.models import load_model

        weights = self.export_weights(changed_only=False)  # every rank calls this (fsdp2: a collective)
        if self.rank != 0:
            return path
        plain = load_model(self.model_spec, dtype="float32")  # a plain copy: the trainee keeps its adapters
        plain.load_state_dict(weights, strict=False)
        return str(save_untied(plain, self.tokenizer, path))

    # -- checkpoint (trainer/learner_state.py writes the sharded one) ----------------------------
    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Full copies of the trainable weights (under fsdp2 a collective: every rank calls it)."""
        return {n: self.strategy.full(p).detach().cpu().clone() for n, p in self.model.named_parameters()
                if p.requires_grad}
