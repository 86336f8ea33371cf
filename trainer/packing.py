"""Training samples and their packing into micro-batches by a token budget.

A `Sample` is one trajectory segment with its advantage. Micro-batches are formed so that each
costs at most `budget` tokens of compute:

    pad     sort by length (descending); fill a micro-batch while rows * longest <= budget.
            Rows are right-padded; similar lengths sit together, so little is wasted.
    concat  first-fit-decreasing by summed length; all sequences of a micro-batch go in ONE row with
            position ids restarting at 0 per sequence, which transformers turns into a block-diagonal
            causal mask (no cross-sequence attention; no padding at all).

A sequence longer than the budget gets a micro-batch of its own. Only positions that predict a
policy token are kept in `MicroBatch.pos`: the learner computes logits there and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import get_args

import torch

from trainer.config import Packing

PACKING_MODES: tuple[str, ...] = get_args(Packing)


@dataclass
class Sample:
    """One segment to train on: tokens, loss mask, behaviour log-probs and versions, one advantage."""

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    versions: list[int]
    advantage: float
    prox_logp: list[float] | None = None
    """Per-token pi_prox log-probs (aligned with token_ids), filled by the learner when recomputed."""
    meta: dict = field(default_factory=dict)
    loss_weight: float = 1.0
    """Weight of each of its policy tokens in the loss (train.loss_agg; 1 under token-mean)."""

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_loss_tokens(self) -> int:
        # token 0 has no predecessor to predict it from, so it can never be trained on
        return sum(self.loss_mask[1:])


@dataclass
class MicroBatch:
    """Model inputs plus flat per-policy-token tensors (gathered at `rows`, `pos`)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    rows: torch.Tensor
    """Row of each policy token's predicting position."""
    pos: torch.Tensor
    """Column of the position whose hidden state predicts the token (token column - 1)."""
    targets: torch.Tensor
    behav_logp: torch.Tensor
    prox_logp: torch.Tensor | None
    versions: torch.Tensor
    advantages: torch.Tensor
    token_weights: torch.Tensor
    """Each policy token's loss weight (its sample's `loss_weight`)."""
    sample_index: torch.Tensor
    """Index (into the packed list of samples) of the sample each policy token belongs to."""
    token_index: torch.Tensor
    """Position of each policy token inside its own sample."""
    samples: list[int]
    """Indices of the samples in this micro-batch."""

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel()) if self.attention_mask is None else int(self.attention_mask.sum())


def plan_micro_batches(lengths: list[int], budget: int, mode: str = "pad",
                       order: list[int] | None = None) -> list[list[int]]:
    """Group sample indices into micro-batches (see module docstring).

    In `pad` mode `order` (default: longest first) is the order micro-batches are filled in; the
    learner passes samples sorted by their tokens, so rows sharing a prompt land together."""
    if mode not in PACKING_MODES:
        raise ValueError(f"unknown packing mode '{mode}'; valid: {', '.join(PACKING_MODES)}")
    bins: list[list[int]] = []
    if mode == "pad":
        widest = 0
        for i in order if order is not None else sorted(range(len(lengths)), key=lambda i: -lengths[i]):
            if bins and (len(bins[-1]) + 1) * max(widest, lengths[i]) <= budget:
                bins[-1].append(i)
                widest = max(widest, lengths[i])
            else:
                bins.append([i])
                widest = lengths[i]
        return bins
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    loads: list[int] = []
    for i in order:
        for b, load in enumerate(loads):
            if load + lengths[i] <= budget:
                bins[b].append(i)
                loads[b] += lengths[i]
                break
        else:
            bins.append([i])
            loads.append(lengths[i])
    return bins


def collate(samples: list[Sample], indices: list[int], mode: str = "pad", pad_id: int = 0) -> MicroBatch:
    """Build the tensors of one micro-batch from `samples[i] for i in indices`."""
    rows_tok: list[list[int]] = []
    rows_pos: list[list[int]] = []
    flat: dict[str, list] = {k: [] for k in ("rows", "pos", "targets", "behav", "prox", "versions", "adv", "w", "sidx", "tidx")}
    has_prox = all(samples[i].prox_logp is not None for i in indices)
    for i in indices:
        s = samples[i]
        if mode == "pad" or not rows_tok:
            rows_tok.append([])
            rows_pos.append([])
        row, offset = len(rows_tok) - 1, len(rows_tok[-1])
        rows_tok[-1].extend(s.token_ids)
        rows_pos[-1].extend(range(len(s.token_ids)))
        for t in range(1, len(s.token_ids)):
            if s.loss_mask[t]:
                flat["rows"].append(row)
                flat["pos"].append(offset + t - 1)
                flat["targets"].append(s.token_ids[t])
                flat["behav"].append(s.logprobs[t])
                flat["prox"].append(s.prox_logp[t] if has_prox else 0.0)
                flat["versions"].append(s.versions[t])
                flat["adv"].append(s.advantage)
                flat["w"].append(s.loss_weight)
                flat["sidx"].append(i)
                flat["tidx"].append(t)
    width = max(len(r) for r in rows_tok)
    ids = torch.full((len(rows_tok), width), pad_id, dtype=torch.long)
    positions = torch.zeros((len(rows_tok), width), dtype=torch.long)
    mask = torch.zeros((len(rows_tok), width), dtype=torch.long)
    for r, (toks, poss) in enumerate(zip(rows_tok, rows_pos, strict=True)):
        ids[r, :len(toks)] = torch.tensor(toks)
        positions[r, :len(poss)] = torch.tensor(poss)
        mask[r, :len(toks)] = 1
    return MicroBatch(
        input_ids=ids, position_ids=positions, attention_mask=mask if mode == "pad" else None,
        rows=torch.tensor(flat["rows"], dtype=torch.long), pos=torch.tensor(flat["pos"], dtype=torch.long),
        targets=torch.tensor(flat["targets"], dtype=torch.long),
        behav_logp=torch.tensor(flat["behav"], dtype=torch.float32),
        prox_logp=torch.tensor(flat["prox"], dtype=torch.float32) if has_prox else None,
        versions=torch.tensor(flat["versions"], dtype=torch.long),
        advantages=torch.tensor(flat["adv"], dtype=torch.float32),
        token_weights=torch.tensor(flat["w"], dtype=torch.float32),
        sample_index=torch.tensor(flat["sidx"], dtype=torch.long),
        token_index=torch.tensor(flat["tidx"], dtype=torch.long), samples=list(indices))
