"""Batched token sampling with per-row parameters and per-row random streams.

For one decoding step, with raw logits z (one row per sequence, fp32):

    behaviour log-prob     logp = log_softmax(z)[token]          (temperature 1, no top-k/top-p)
    sampling distribution  q = softmax(z / T), restricted to the k most likely tokens (top-k) and to
                           the smallest prefix of the sorted q whose mass reaches p (top-p), renormalised
    draw                   token = min{ j : CDF_q(j) > u * CDF_q(V) },  u ~ U[0, 1)   (inverse CDF)
    greedy (T = 0)         token = argmax z

Why the log-prob ignores T, top-k and top-p: RL needs log pi(token) of the policy being trained, and the
trainer's teacher-forced forward pass computes exactly log_softmax(z); so the recorded behaviour log-prob
equals that forward pass under the same weights. (The tokens are still *drawn* from q, as asked.)

Why one uniform per row drawn by inverse CDF: it makes the draw a single vectorised `searchsorted` for
the whole batch, while a seeded request draws its u from its own torch.Generator — so its samples do not
depend on which other requests share the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class BatchParams:
    """Per-row sampling parameters as tensors (rebuilt only when the batch composition changes)."""

    temperature: torch.Tensor
    """[n] float; 0 means greedy."""
    top_p: torch.Tensor
    """[n] float in (0, 1]."""
    top_k: torch.Tensor
    """[n] long; 0 means no top-k."""
    generators: list[torch.Generator | None]
    """Per-row generator of seeded requests (None: use the engine's shared stream)."""
    top_logprobs: int
    """Largest number of top log-probs any row asked for (0: none)."""

    @classmethod
    def build(cls, temps: list[float], top_ps: list[float], top_ks: list[int],
              generators: list[torch.Generator | None], top_logprobs: int) -> BatchParams:
        return cls(torch.tensor(temps, dtype=torch.float32), torch.tensor(top_ps, dtype=torch.float32),
                   torch.tensor(top_ks, dtype=torch.long), generators, top_logprobs)


@dataclass
class StepSample:
    tokens: list[int]
    logprobs: list[float]
    top: list[list[tuple[int, float]]] | None
    """Per row: the `top_logprobs` most likely (token, log-prob) pairs, when any row asked for them."""


def draw_uniforms(generators: list[torch.Generator | None], shared: torch.Generator) -> torch.Tensor:
    """One U[0,1) per row: seeded rows from their own generator, the rest from the shared one."""
    n = len(generators)
    u = torch.rand(n, generator=shared, dtype=torch.float64)
    for i, g in enumerate(generators):
        if g is not None:
            u[i] = torch.rand((), generator=g, dtype=torch.float64)
    return u


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """Per row, the first index whose cumulative (unnormalised) mass exceeds u * total mass.

    Two levels keep it cheap: block sums locate the block, then one fp64 cumsum inside that block of
    `block` tokens, never a cumsum over the whole vocabulary. The block sums are taken in fp32 (torch's
    cascaded sum, relative error ~1e-7; an fp64 sum would first copy the whole [n, vocab] to fp64, which
    cost more than the rest of a sampling step) and accumulated in fp64.
    """
    n, vocab = probs.shape
    pad = (-vocab) % block
    if pad:
        probs = torch.nn.functional.pad(probs, (0, pad))
    blocks = probs.view(n, -1, block)
    block_cdf = blocks.sum(-1).double().cumsum(-1)
    target = (u * block_cdf[:, -1])[:, None]
    b = torch.searchsorted(block_cdf, target, right=True).clamp_(max=block_cdf.shape[1] - 1)
    before = torch.where(b > 0, block_cdf.gather(1, (b - 1).clamp_(min=0)), torch.zeros_like(target))
    inner = blocks[torch.arange(n, device=probs.device), b[:, 0]].double().cumsum(-1) + before
    j = torch.searchsorted(inner, target, right=True).clamp_(max=block - 1)
    return (b * block + j)[:, 0].clamp_(max=vocab - 1)


def _rows(mask: torch.Tensor) -> torch.Tensor | None:
    """Indices of the rows a filter applies to, or None when it applies to all (no gather/scatter)."""
    return None if bool(mask.all()) else mask.nonzero()[:, 0]


def _keep_top_k(probs: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    rows = _rows(top_k > 0)
    sub, k = (probs, top_k) if rows is None else (probs[rows], top_k[rows])
    k = k.clamp(max=probs.shape[1])
    values = torch.topk(sub, int(k.max()), dim=-1).values
    kept = torch.where(sub >= values.gather(1, (k - 1)[:, None]), sub, 0.0)
    if rows is None:
        return kept
    probs[rows] = kept
    return probs


def _keep_top_p(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Zero everything outside each row's nucleus. The nucleus is found among the top 256, then 4096
    tokens (a partial sort, cheap), and only rows whose nucleus is wider pay for a full sort."""
    rows = _rows(top_p < 1)
    sub, p = (probs, top_p) if rows is None else (probs[rows], top_p[rows])
    target = p * sub.sum(-1)
    threshold = torch.zeros_like(target)
    todo = torch.ones_like(target, dtype=torch.bool)
    for k in (256, 4096, probs.shape[1]):
        idx = todo.nonzero()[:, 0]
        if not len(idx):
            break
        values = torch.topk(sub[idx], min(k, probs.shape[1]), dim=-1).values
        cum = values.cumsum(-1)
        enough = (cum[:, -1] >= target[idx]) | (k >= probs.shape[1])
        count = ((cum - values) < target[idx, None]).sum(-1).clamp_(min=1)
        threshold[idx] = torch.where(enough, values.gather(1, (count - 1)[:, None])[:, 0], threshold[idx])
        todo[idx] = ~enough
    kept = torch.where(sub >= threshold[:, None], sub, 0.0)
    if rows is None:
        return kept
    probs[rows] = kept
    return probs


def sample(logits: torch.Tensor, params: BatchParams, shared: torch.Generator) -> StepSample:
    """Sample one token per row of `logits` [n, vocab] (see the module docstring for the rule)."""
    logits = logits.float()
    n, vocab = logits.shape
    temps = params.temperature.to(logits.device)
    greedy = temps <= 0
    lse = None
    if bool(greedy.all()):
        tokens = torch.argmax(logits, dim=-1)
    else:
        u = draw_uniforms(params.generators, shared).to(logits.device)
        if bool((temps == 1).all()):  # the unnormalised probabilities also give the log-normaliser
            top = logits.amax(dim=-1, keepdim=True)
            probs = (logits - top).exp_()
            lse = top[:, 0] + probs.sum(dim=-1).log()
        else:
            probs = torch.softmax(logits / torch.where(greedy, torch.ones_like(temps), temps)[:, None], dim=-1)
        top_k, top_p = params.top_k.to(logits.device), params.top_p.to(logits.device)
        if bool((top_k > 0).any()):
            probs = _keep_top_k(probs, top_k)
        if bool((top_p < 1).any()):
            probs = _keep_top_p(probs, top_p)
        tokens = inverse_cdf(probs, u)
        if bool(greedy.any()):
            tokens = torch.where(greedy, torch.argmax(logits, dim=-1), tokens)
    if lse is None:
        lse = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(1, tokens[:, None])[:, 0] - lse
    top = None
    if params.top_logprobs > 0:
        values, ids = torch.topk(logits, min(params.top_logprobs, vocab), dim=-1)
        values = values - lse[:, None]
        top = [list(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
    return StepSample(tokens.tolist(), logprobs.tolist(), top)
