"""Data-parallel learners on Ray: one `Learner` per actor, over one torch.distributed process group.

    rank 0 picks a free TCP port -> every rank joins the process group (gloo on CPU, NCCL on GPU)
    train_step: the batch is split across ranks balanced by tokens; each rank runs Learner.train_step
    on its share; the loss is divided by the *global* token count and gradients are summed (DDP, or
    FSDP2's reduce-scatter: trainer/strategy.py), so the result equals one learner training on the
    whole batch. Rank 0 exports the weights for the engines (under fsdp2 every rank takes part in the
    gathers); every rank writes its shards of a checkpoint (trainer/learner_state.py).

A rank that dies (or does not answer a call within `timeout_s`) raises `LearnerLost`: the optimizer
state lived only in that process, so the training loop restarts from the newest checkpoint
(trainer/train.py), never trains on with ranks out of step.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from typing import Any

from trainer.config import FullConfig
from trainer.packing import Sample


class LearnerWorker:
    """Ray actor body: one data-parallel rank."""

    def __init__(self, cfg: FullConfig, rank: int, world_size: int, threads: int):
        import torch

        torch.set_num_threads(max(1, threads))
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.learner: Any = None

    def address(self) -> tuple[str, int]:
        """This node's IP and the port of the rendezvous rank 0 hosts. The socket is bound and listening
        here and handed to the store in `join_group`: no other process can take the port in between, and on a
        local cluster (node IP 127.0.0.1, trainer/placement.py) it listens on loopback only."""
        import ray

        host = ray.util.get_node_ip_address()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host if _loopback(host) else "", 0), family=family, backlog=128)
        return host, self._listener.getsockname()[1]

    def setup(self, master: tuple[str, int] | None) -> int:
        import torch

        from trainer.learner import Learner

        device = self._device()
        if self.world_size > 1:
            # on GPUs NCCL for the CUDA tensors, gloo beside it for CPU ones (offloaded state, checkpoint plans)
            self.join_group(master, "cpu:gloo,cuda:nccl" if device.startswith("cuda") else "gloo")
        t = self.cfg.train
        self.learner = Learner(t, self.cfg.engine.model, device=device, rank=self.rank, world_size=self.world_size,
                               seed=self.cfg.run.seed)
        return sum(p.numel() for p in self.learner.params) if torch is not None else 0

    def join_group(self, master: tuple[str, int], backend: str) -> None:
        """Join the process group whose store rank 0 hosts at `master` (`address`)."""
        import torch.distributed as dist
        from torch.distributed.constants import default_pg_timeout

        if _loopback(master[0]):
            # The collectives' own sockets follow: gloo and NCCL listen on the interface named here
            # (gloo otherwise on whatever the hostname resolves to, NCCL on the first non-loopback one).
            lo = next((name for _, name in socket.if_nameindex() if name.startswith("lo")), "lo")
            os.environ["GLOO_SOCKET_IFNAME"] = os.environ["NCCL_SOCKET_IFNAME"] = lo
        listen_fd = self._listener.detach() if self.rank == 0 else None
        store = dist.TCPStore(master[0], master[1], self.world_size, is_master=self.rank == 0,
                              timeout=default_pg_timeout, master_listen_fd=listen_fd)
        dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.world_size)

    def _device(self) -> str:
        from trainer.placement import actor_device

        return actor_device(self.cfg.engine.device, "learner")

    def train_step(self, samples: list[Sample], version: int, objective: str = "ppo") -> dict[str, Any]:
        from core.memory import release_free_memory

        stats = self.learner.train_step(samples, version, objective)
        release_free_memory()  # this step's activations and micro-batches, freed but kept by malloc
        return stats

    def export_weights(self) -> dict[str, Any]:
        from serving.models import torch_dtype

        return self.learner.export_weights(dtype=torch_dtype(self.cfg.engine.dtype, "cpu"))

    def save_for_engine(self, path: str, adapter: bool = False) -> str:
        return self.learner.save_for_engine(path, adapter)

    def rendezvous(self) -> tuple[str, int]:
        """Address and a free port on this node for the weight-update group rank 0 opens with the servers."""
        import ray

        from serving.launch.servers import free_port

        host = ray.util.get_node_ip_address()
        return host, free_port("127.0.0.1" if _loopback(host) else host)

    def start_push(self, backend: str, urls: list[str], gpus_per_server: int, master: tuple[str, int],
                   timeout_s: float) -> None:
        """Open the `nccl` weight-update group with the servers (serving/remote/weight_transfer.py), once per run."""
        from serving.models import torch_dtype
        from serving.remote import weight_transfer

        weight_transfer.check_nccl(backend)  # vLLM's trainer side must import in this process
        dtype, device = torch_dtype(self.cfg.engine.dtype, "cuda"), self._device()
        self.push = weight_transfer.start_push(
            backend, urls, gpus_per_server, rank=self.rank, host=master[0], port=master[1], timeout_s=timeout_s,
            weights=lambda: self.learner.engine_weights(dtype, changed_only=False, untie=True, device=device),
            meta=self.learner.engine_weight_meta(dtype, untie=True))

    def push_weights(self, version: int) -> None:
        self.push.send(version)

    def save(self, folder: str) -> None:
        from trainer import learner_state

        learner_state.save(self.learner, folder)  # every rank: its shards (rank 0 also the JSON)

    def load(self, folder: str) -> None:
        from trainer import learner_state

        learner_state.load(self.learner, folder)

    def logprobs(self, samples: list[Sample]) -> list[list[float]]:
        return self.learner.logprobs(samples)

    def pid(self) -> int:
        return os.getpid()


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def split_by_tokens(samples: list[Sample], n: int) -> list[list[Sample]]:
    """Longest-first onto the least-loaded rank: shares differ by at most one sample's tokens."""
    shares: list[list[Sample]] = [[] for _ in range(n)]
    loads = [0] * n
    for s in sorted(samples, key=len, reverse=True):
        r = loads.index(min(loads))
        shares[r].append(s)
        loads[r] += len(s)
    return shares


class LearnerLost(RuntimeError):
    """A learner rank died or hung; its in-memory state (weights, optimizer) is gone."""


class LearnerGroup:
    """The learner ranks as one object the training loop calls."""

    def __init__(self, cfg: FullConfig, placement: dict[str, Any], threads: int, timeout_s: float = 3600.0,
                 wait: bool = True):
        """Create the ranks and have each build its learner; with `wait=False` the caller waits on
        `self.loading` (with other actors' loading, say) before the first call."""
        import ray

        n = max(1, cfg.train.learner_workers)
        cls = ray.remote(LearnerWorker)
        self.timeout_s = timeout_s
        self.sharded = n > 1 and cfg.train.learner.strategy == "fsdp2"
        """Weights live in shards: an export is a gather every rank takes part in."""
        self.actors = [cls.options(max_restarts=0, **placement).remote(cfg, r, n, threads) for r in range(n)]
        master = self.actors[0].address.remote() if n > 1 else None  # a ref: Ray resolves it before setup runs
        self.loading = [a.setup.remote(master) for a in self.actors]
        """Refs of each rank's setup (its trainable parameter count)."""
        if wait:
            ray.get(self.loading)

    async def _call(self, what: str, refs: list[Any]) -> list[Any]:
        """Await one call per rank; a dead or silent rank becomes `LearnerLost` naming it."""
        from trainer.controller import lost_errors

        tasks = [asyncio.ensure_future(r) for r in refs]
        done, pending = await asyncio.wait(tasks, timeout=self.timeout_s)
        for t in pending:
            t.cancel()
        if pending:
            hung = [i for i, t in enumerate(tasks) if t in pending]
            raise LearnerLost(f"learner rank(s) {hung} did not finish {what} within {self.timeout_s:g}s "
                              "(train.learner_step_timeout_s)")
        for i, t in enumerate(tasks):
            if isinstance(t.exception(), lost_errors()):
                raise LearnerLost(f"learner rank {i} died during {what}: {type(t.exception()).__name__}")
        return [t.result() for t in tasks]

    async def train_step(self, samples: list[Sample], version: int, objective: str = "ppo") -> dict[str, Any]:
        """One step of every rank on its share; `objective` is the learner's loss (`ppo`, or `sft` for `hexsearch sft`)."""
        shares = split_by_tokens(samples, len(self.actors))
        results = await self._call(f"train_step at version {version}",
                                   [a.train_step.remote(s, version, objective) for a, s in zip(self.actors, shares, strict=True)])
        return results[0]

    async def dead_ranks(self, timeout_s: float = 10.0) -> list[int]:
        """Ranks that no longer answer (died, or their process is gone)."""
        async def alive(a: Any) -> bool:
            try:
                await asyncio.wait_for(a.pid.remote(), timeout_s)
                return True
            except Exception:
                return False
        answers = await asyncio.gather(*(alive(a) for a in self.actors))
        return [i for i, ok in enumerate(answers) if not ok]

    def _exporters(self) -> list[Any]:
        return self.actors if self.sharded else self.actors[:1]

    def export_ref(self) -> Any:
        """ObjectRef of rank 0's exported weights (resolved inside the engine actors); under fsdp2 the
        other ranks run the same export (their part of the gathers) and return nothing."""
        return [a.export_weights.remote() for a in self._exporters()][0]

    async def save_for_engine(self, path: str, adapter: bool = False) -> str:
        return (await self._call("save_for_engine", [a.save_for_engine.remote(path, adapter)
                                                     for a in self._exporters()]))[0]

    def start_push(self, backend: str, urls: list[str], gpus_per_server: int, timeout_s: float) -> None:
        """`train.weight_transfer=nccl`: every rank sets up its part of the weight push (rank 0 opens the group)."""
        import ray

        master = ray.get(self.actors[0].rendezvous.remote())
        ray.get([a.start_push.remote(backend, urls, gpus_per_server, master, timeout_s) for a in self._exporters()])

    async def push_weights(self, version: int) -> None:
        """Send the weights to the servers over the group `start_push` opened (every rank: fsdp2 gathers)."""
        await self._call(f"weight push of v{version}", [a.push_weights.remote(version) for a in self._exporters()])

    async def save(self, folder: str) -> None:
        await self._call("checkpoint save", [a.save.remote(folder) for a in self.actors])

    async def load(self, folder: str) -> None:
        await self._call("checkpoint load", [a.load.remote(folder) for a in self.actors])

