"""Learner strategies: how the data-parallel ranks hold the model and combine their gradients.

    plain   one rank: the model as it is
    ddp     torch DistributedDataParallel: a full replica per rank; the micro-batches of a minibatch run
            under `no_sync` except the last, whose backward sums the gradients over ranks in buckets
    fsdp2   `torch.distributed.fsdp.fully_shard` on every decoder layer and on the root: each rank keeps
            1/N of every parameter, gradient and AdamW moment; a layer is all-gathered for its forward
            and its backward, its gradient reduce-scattered after each micro-batch

Every strategy *sums* gradients over ranks (DDP and FSDP average by default): the loss is already divided
by the global policy-token count, so the sum equals one learner on the whole batch. The learner's loss,
packing and prefix sharing (trainer/learner.py) only see `forward`, `backward_sync`, `clip` and
`full_state_dict`; they are the same code under every strategy.

With several ranks every forward of a wrapped model is a collective (FSDP's all-gathers), so ranks run
the same number of micro-batches (`lockstep`: a rank with fewer runs zero-loss dummies) and one forward
per micro-batch (the step-wide shared prefix, a second forward, is off; see docs/scale-out.md).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist

from trainer.config import LearnerConfig, Strategy


class PolicyForward(torch.nn.Module):
    """The one module a strategy wraps: decoder (with shared-prefix reuse) + lm_head at policy positions.

    `hidden(ids, pos, mask, stem)` is the learner's decoder pass; `head` returns the output embedding."""

    def __init__(self, model: torch.nn.Module, hidden: Any, head: Any):
        super().__init__()
        self.model = model
        self._hidden, self._head = hidden, head

    def forward(self, ids, pos, mask, rows, cols, stem=None):  # noqa: D102
        return self._head()(self._hidden(ids, pos, mask, stem)[rows, cols])


def _sum_allreduce(_state, bucket):  # no annotations: DDP checks them against the real classes
    """DDP communication hook: sum the bucket over ranks (DDP's default divides by the world size)."""
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


class LearnerStrategy:
    """`plain` (one rank), `ddp` or `fsdp2` around a `PolicyForward` (see module docstring)."""

    def __init__(self, cfg: LearnerConfig, world_size: int, device: str, *, bf16: bool, decoder_layers: Any):
        from core.choices import check_choices

        check_choices(cfg, "train.learner")
        self.name: Strategy | str = cfg.strategy if world_size > 1 else "plain"
        self.cfg, self.world_size, self.device = cfg, world_size, device
        self.sharded = self.name == "fsdp2"
        self.lockstep = world_size > 1
        self.mixed_precision = self.sharded and bf16  # FSDP casts the gathered weights; no autocast
        if cfg.cpu_offload and not device.startswith("cuda"):
            raise ValueError("train.learner.cpu_offload=true offloads GPU memory to the CPU; this learner runs on "
                             f"{device!r} (set engine.device=cuda, or cpu_offload=false)")
        if cfg.cpu_offload and not self.sharded:
            raise ValueError("train.learner.cpu_offload needs train.learner.strategy=fsdp2 and learner_workers >= 2")
        self._layers = decoder_layers
        self.module: Any = None

    def wrap(self, policy: PolicyForward) -> None:
        """Wrap the policy for this strategy; the optimizer must be built after (FSDP2 swaps the parameters)."""
        if self.name == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            cuda = self.device.startswith("cuda")
            ids = [torch.device(self.device).index or 0] if cuda else None
            self.module = DistributedDataParallel(policy, device_ids=ids, forward_sync_buffers=False)
            self.module.register_comm_hook(None, _sum_allreduce)
        elif self.name == "fsdp2":
            self.module = self._fully_shard(policy)
        else:
            self.module = policy

    def _fully_shard(self, policy: PolicyForward) -> Any:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        mesh = init_device_mesh(self.device.split(":")[0], (self.world_size,))
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if self.mixed_precision else MixedPrecisionPolicy())
        offload = CPUOffloadPolicy() if self.cfg.cpu_offload else OffloadPolicy()
        kw = {"mesh": mesh, "mp_policy": mp, "offload_policy": offload}
        units = [fully_shard(layer, reshard_after_forward=self.cfg.reshard_after_forward, **kw)
                 for layer in self._layers]
        units.append(fully_shard(policy, **kw))  # embeddings, final norm, lm_head (tied or not)
        for unit in units:
            unit.set_gradient_divide_factor(1.0)  # sum, not mean (module docstring)
            unit.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM; NCCL zero-copy)
        return policy

    def forward(self, *args: Any) -> torch.Tensor:
        return self.module(*args)

    def backward_sync(self, last: bool) -> contextlib.AbstractContextManager:
        """Around a micro-batch's forward+backward: DDP reduces only in the last one of a minibatch."""
        if self.name == "ddp" and not last:
            return self.module.no_sync()
        return contextlib.nullcontext()

    def clip(self, params: list[torch.nn.Parameter], max_norm: float) -> float:
        """Clip the global gradient norm (over all ranks' shards) to `max_norm`; returns the norm before."""
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if hasattr(norm, "full_tensor"):  # a DTensor under fsdp2: partial norms reduced here
            norm = norm.full_tensor()
        return float(norm)

    def full(self, t: torch.Tensor) -> torch.Tensor:
        """The whole tensor of a (possibly sharded) parameter; a collective under fsdp2: every rank calls it."""
        return t.full_tensor() if hasattr(t, "full_tensor") else t

    def lockstep_count(self, n: int) -> int:
        """The most micro-batches any rank has (every rank runs that many; see `lockstep`)."""
        if not self.lockstep:
            return n
        t = torch.tensor([n], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t[0])
