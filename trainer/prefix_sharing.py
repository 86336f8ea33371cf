"""Prefix sharing in the learner's forward: rows (or a whole step's samples) that start with the same tokens
compute those tokens' keys/values once.

`shared_prefix` finds the prefix every row of a micro-batch shares (a group's question), which
`Learner._hidden` runs once and repeats per row; `Stem` holds a step-wide prefix (the system prompt and
worked examples) that `Learner._stem` computed once for all micro-batches, and sends its gradient back
through that one forward. Both give exactly the values and gradients of the full forward.
"""

from __future__ import annotations

import torch


def shared_prefix(ids: torch.Tensor, mask: torch.Tensor | None) -> int:
    """Length of the token prefix every row shares (at most the shortest row minus one)."""
    if ids.shape[0] < 2 or mask is None:
        return 0
    same = (ids == ids[:1]).all(dim=0).long()
    common = int(same.cumprod(0).sum())
    return max(0, min(common, int(mask.sum(1).min()) - 1))


class Stem:
    """The keys/values of a step-wide shared prefix, computed once with gradients.

    Every micro-batch starts from detached leaf copies of them, so its backward stops there and
    accumulates d(loss)/d(keys, values) in the leaves; `backward()` then sends the summed gradient
    through the stem's own forward once. Same gradient as running the stem in every micro-batch:
    the total derivative is the sum over micro-batches, and backward is linear."""

    def __init__(self, length: int, kv: list[tuple[torch.Tensor, torch.Tensor]]):
        self.length, self.kv = length, kv
        self.leaves = [(k.detach().requires_grad_(), v.detach().requires_grad_()) for k, v in kv]

    def cache(self):
        from transformers import DynamicCache

        return DynamicCache(ddp_cache_data=self.leaves)

    def backward(self) -> None:
        outs, grads = [], []
        for (k, v), (lk, lv) in zip(self.kv, self.leaves, strict=True):
            for out, leaf in ((k, lk), (v, lv)):
                if leaf.grad is not None:
                    outs.append(out)
                    grads.append(leaf.grad)
        if outs:
            torch.autograd.backward(outs, grads)
