"""Decoupled PPO (AReaL): a trust region around pi_prox, an importance weight for pi_behav.

For every policy token t with advantage A_t:

    r_t    = pi_theta(a_t) / pi_prox(a_t)            ratio against the proximal (pre-step) policy
    w_t    = pi_prox(a_t)  / pi_behav(a_t)           behaviour weight (the sampler was older)
    keep_t = w_t <= cap                              tokens far off-policy are masked, not clamped
    l_t    = -w_t * min(r_t A_t, clip(r_t, 1 - eps, 1 + eps_high) A_t)

    loss   = sum_t c_t * keep_t * l_t / N            token-mean (train.loss_agg): c_t = 1, N = policy tokens
                                                     of the whole batch (masking does not shrink N, so it never
                                                     inflates gradients)
             seq-mean-token-mean: c_t = 1 / T_e, T_e = policy tokens of token t's episode (all its segments),
                                  N = sum_t c_t = the number of episodes: the mean of each episode's token-mean

The learner may add an entropy bonus, - entropy_coef * sum_t c_t H(pi_theta(. | s_t)) / N (off by default).

The SFT objective (`sft_loss`, `hexsearch sft`) is the token-mean negative log-likelihood of the same
policy tokens (loss_mask == 1), with no advantage, ratio or behaviour weight:

    loss_sft = - sum_t log pi_theta(a_t | s_t) / N

When pi_prox == pi_behav (on-policy samples) w_t = 1 and this is exactly PPO-clip. pi_prox is the
policy before this optimizer step: recomputed by a forward pass (exact), or approximated per token
from versions (`loglinear_prox_logp`), which saves that pass when several minibatches are used.

`LossStats` also sums |log pi_prox - log pi_behav| over all tokens and over fresh ones (sampled at the
current version), where it is pure engine/learner numerics (bf16 engines make it visible).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class LossStats:
    """Sums over the tokens of one micro-batch (divide by `tokens` for means); summed across micro-batches.

    `logp_mismatch_sum` is sum |log pi_prox - log pi_behav| over all tokens; `fresh_tokens` and
    `fresh_logp_mismatch_sum` count and sum the same over the tokens marked `fresh` (sampled by the
    current weights, so any difference is numerical mismatch between engine and learner).
    """

    tokens: float = 0.0
    clipped: float = 0.0
    behav_masked: float = 0.0
    behav_weight_sum: float = 0.0
    behav_weight_max: float = 0.0
    behav_weight_min: float = float("inf")
    approx_kl_sum: float = 0.0
    logp_mismatch_sum: float = 0.0
    fresh_tokens: float = 0.0
    fresh_logp_mismatch_sum: float = 0.0
    nll_sum: float = 0.0
    """sum -log pi_theta(a_t) over the tokens (the SFT loss before dividing by N; also logged under PPO)."""

    def add(self, other: LossStats) -> LossStats:
        merged = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        merged["behav_weight_max"] = max(self.behav_weight_max, other.behav_weight_max)
        merged["behav_weight_min"] = min(self.behav_weight_min, other.behav_weight_min)
        return LossStats(**merged)


def decoupled_ppo_loss(
    logp: torch.Tensor, prox_logp: torch.Tensor, behav_logp: torch.Tensor, advantages: torch.Tensor,
    *, eps_clip: float = 0.2, eps_clip_high: float | None = None, behav_weight_cap: float = 5.0,
    normalizer: float | None = None, fresh: torch.Tensor | None = None, token_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """The decoupled PPO loss over flat per-token tensors (policy tokens only; see module docstring).

    `normalizer` is N, the sum of the token weights c_t (default 1: the policy-token count) over the whole
    (global, all data-parallel ranks) batch; the default is this call's, i.e. a plain token-mean.
    `token_weight` is c_t (default 1). `fresh` (bool per token) marks tokens sampled by the current weights;
    it only feeds the stats. Returns (loss, stats).
    """
    eps_high = eps_clip if eps_clip_high is None else eps_clip_high
    prox_logp, behav_logp, advantages = prox_logp.detach(), behav_logp.detach(), advantages.detach()
    n = logp.numel()
    c = token_weight.detach() if token_weight is not None else torch.ones_like(logp.detach())
    # N by default is this call's own weight sum (a token-mean); the floor keeps an empty call's loss at 0, not nan
    norm = float(normalizer) if normalizer is not None else max(float(c.sum()), 1e-12)
    ratio = torch.exp(logp - prox_logp)
    clipped_ratio = torch.clamp(ratio, 1.0 - eps_clip, 1.0 + eps_high)
    surrogate = torch.minimum(ratio * advantages, clipped_ratio * advantages)
    weight = torch.exp(prox_logp - behav_logp)
    keep = weight <= behav_weight_cap if behav_weight_cap > 0 else torch.ones_like(weight, dtype=torch.bool)
    token_loss = -weight * surrogate * c
    loss = torch.where(keep, token_loss, torch.zeros_like(token_loss)).sum() / norm
    with torch.no_grad():
        was_clipped = (clipped_ratio * advantages < ratio * advantages) & keep
        mismatch = (prox_logp - behav_logp).abs()
        stats = LossStats(
            tokens=float(n), clipped=float(was_clipped.sum()), behav_masked=float((~keep).sum()),
            behav_weight_sum=float(weight.sum()),
            behav_weight_max=float(weight.max()) if n else 0.0,
            behav_weight_min=float(weight.min()) if n else float("inf"),
            approx_kl_sum=float((prox_logp - logp.detach()).sum()),
            logp_mismatch_sum=float(mismatch.sum()),
            fresh_tokens=float(fresh.sum()) if fresh is not None else 0.0,
            fresh_logp_mismatch_sum=float(mismatch[fresh.bool()].sum()) if fresh is not None else 0.0,
            nll_sum=-float(logp.detach().sum()))
    return loss, stats


def sft_loss(logp: torch.Tensor, *, normalizer: float | None = None) -> tuple[torch.Tensor, LossStats]:
    """Token-mean NLL of the policy tokens (see the module docstring): `logp` are log pi_theta of the tokens
    with loss_mask == 1, `normalizer` N the policy-token count of the whole batch (all ranks; default: this
    call's count), so micro-batch and rank gradients sum to the exact token-mean. Returns (loss, stats)."""
    n = logp.numel()
    norm = float(normalizer if normalizer is not None else max(n, 1))
    loss = -logp.sum() / norm
    return loss, LossStats(tokens=float(n), nll_sum=-float(logp.detach().sum()))


def loglinear_prox_logp(behav_logp: torch.Tensor, theta_logp: torch.Tensor, versions: torch.Tensor,
                        current_version: int) -> torch.Tensor:
    """AReaL's log-linear pi_prox approximation, per token.

    With v_prox = current_version (the weights before this step), v_theta = v_prox + 1 and the token's
    behaviour version v_b:  alpha = clamp((v_prox - v_b) / (v_theta - v_b), 0, 1),
    log pi_prox ~= log pi_behav + alpha * (log pi_theta - log pi_behav).  A fresh token (v_b = v_prox)
    gets pi_prox = pi_behav exactly.
    """
    v_prox = float(current_version)
    vb = versions.to(behav_logp.dtype)
    alpha = torch.clamp((v_prox - vb) / (v_prox + 1.0 - vb), 0.0, 1.0)
    return behav_logp + alpha * (theta_logp.detach() - behav_logp)
