"""Weight updates of remote servers without a full checkpoint on disk (see docs/scale-out.md).

`train.weight_transfer` picks how vLLM/SGLang servers get each new version (embedded engines always take the
weights in memory):

    disk      the learner saves the merged, untied model; the servers reload it (serving/remote*.py)
    adapter   LoRA runs on vLLM: the learner saves only the adapter (PEFT `save_pretrained`: a few MB) and
              the server loads it under a new name, `policy-v<version>`:
                  POST /v1/load_lora_adapter   {"lora_name", "lora_path"}
                  POST /v1/unload_lora_adapter {"lora_name": <the previous one>}
              generate requests then name the adapter as their model. The server runs with `--enable-lora
              --max-lora-rank <r>` and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (managed servers start so).
    nccl      learner rank 0 sends the tensors to every GPU of every server by NCCL broadcast, nothing on disk.
              Set up once when the run starts (`start_push`), driven by the weight sync each step:
        vLLM    vLLM's own trainer-side engine (`vllm.distributed.weight_transfer`, which must be importable
                in the learner's process: the `gpu` extra). Once: POST /init_weight_transfer_engine on every
                server (rank offsets 1, 1 + its GPUs, ...) while rank 0 opens the group; per sync:
                /start_weight_update, /update_weights while rank 0 broadcasts, /finish_weight_update. The
                servers run with `--weight-transfer-config '{"backend": "nccl"}'`.
        SGLang  once: POST /init_weights_update_group {"master_address", "master_port", "rank_offset",
                "world_size", "group_name", "backend"} on every server while rank 0 joins (`trainer_group`);
                per sync: POST /update_weights_from_distributed {"names", "dtypes", "shapes", "group_name",
                "flush_cache", "weight_version"} while rank 0 `broadcast`s the tensors in that order.
              The engine clients then only label the servers' weights with the version (`Transferred`).
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ADAPTER_FILE = "adapter_config.json"
GROUP_NAME = "hexsearch-weights"


def is_adapter_dir(path: str | Path) -> bool:
    """A folder holding a PEFT adapter (not a whole model)."""
    return (Path(path) / ADAPTER_FILE).is_file()


def adapter_name(version: int) -> str:
    return f"policy-v{version}"


def check_nccl(backend: str, learner_gpus: float | None = None) -> None:
    """Refuse `train.weight_transfer=nccl` where it cannot work, at startup (never a silent fall back to disk):
    an engine without a weight-transfer group, vLLM without its trainer side importable here (the learner's
    Python), a learner without a GPU (`learner_gpus` 0; None: not known yet)."""
    if backend not in ("vllm", "sglang"):
        raise ValueError(f"train.weight_transfer=nccl sends weights to vLLM or SGLang servers; engine.backend={backend} "
                         "has no NCCL weight-update group (use train.weight_transfer=disk)")
    if backend == "vllm" and importlib.util.find_spec("vllm") is None:
        raise RuntimeError(
            "train.weight_transfer=nccl with engine.backend=vllm drives vLLM's trainer-side weight-transfer engine "
            f"(vllm.distributed.weight_transfer) in the learner's process, but vllm is not importable in {sys.executable}: "
            "install the gpu extra there (pip install 'hexsearch[gpu]') or set train.weight_transfer=disk")
    if learner_gpus is not None and learner_gpus <= 0:
        raise RuntimeError("train.weight_transfer=nccl broadcasts from learner rank 0's GPU (NCCL), but the learners "
                           "hold no GPU here: run them on GPUs (engine.device=auto on a GPU cluster) or set "
                           "train.weight_transfer=disk")


def wire_meta(tensors: dict[str, Any]) -> dict[str, list]:
    """Names, dtypes (`bfloat16`, ...) and shapes of the tensors, in broadcast order (SGLang's request fields)."""
    return meta_fields([(n, t.dtype, tuple(t.shape)) for n, t in tensors.items()])


def meta_fields(meta: list[tuple[str, Any, tuple[int, ...]]]) -> dict[str, list]:
    return {"names": [m[0] for m in meta], "dtypes": [str(m[1]).removeprefix("torch.") for m in meta],
            "shapes": [list(m[2]) for m in meta]}


def trainer_group(master_address: str, master_port: int, world_size: int, group_name: str) -> Any:
    """Learner rank 0's side of the SGLang update group (rank 0): an NCCL process group over a TCP store that
    rank 0 hosts, prefixed by `group_name` the way torch.distributed names a group, which is how SGLang's
    `init_custom_process_group` joins it from the servers. Not the learners' own process group."""
    import torch.distributed as dist

    store = dist.TCPStore(master_address, master_port, world_size, is_master=True)
    return dist.ProcessGroupNCCL(dist.PrefixStore(f"{group_name}/", store), 0, world_size)


def broadcast(group: Any, tensors: dict[str, Any] | Iterable[tuple[str, Any]]) -> None:
    """Send every tensor (on the GPU, in `wire_meta` order) from rank 0 to the servers' ranks."""
    import torch.distributed as dist

    for _, t in (tensors.items() if isinstance(tensors, dict) else tensors):
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        group.broadcast([t.cuda().contiguous()], opts).wait()


Weights = Callable[[], Iterator[tuple[str, Any]]]
"""A fresh pass over the learner's weights for the engines: (name, tensor) one at a time, on every learner rank
(a gather under fsdp2); ranks other than 0 get None tensors."""


def start_push(backend: str, urls: list[str], gpus_per_server: int, *, rank: int, host: str, port: int,
               weights: Weights, meta: list[tuple[str, Any, tuple[int, ...]]], timeout_s: float = 600.0) -> Any:
    """Open the weight-update group of learner `rank` with the servers (rank 0 sends; the others only take part
    in the gathers); returns an object whose `send(version)` pushes the weights."""
    cls = _VLLMPush if backend == "vllm" else _SGLangPush
    return cls(urls, max(1, gpus_per_server), rank, host, port, weights, meta, timeout_s)


class _VLLMPush:
    """vLLM's trainer-side NCCL engine over every server (one group: rank 0 and all servers' GPUs)."""

    def __init__(self, urls, gpus, rank, host, port, weights, meta, timeout_s):
        from vllm.distributed.weight_transfer import (
            HTTPVLLMWeightSyncClient,
            ParamMeta,
            WeightSource,
            WeightTransferTrainerFactory,
        )
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        class LearnerSource(WeightSource):
            def metadata(self):
                return [ParamMeta(n, d, tuple(s)) for n, d, s in meta]

            def __iter__(self):
                return weights()

        client = _FanOut([HTTPVLLMWeightSyncClient(u, timeout=timeout_s) for u in urls], gpus)
        info = NCCLTrainerInitInfo(master_address=host, master_port=port, world_size=1 + gpus * len(urls), rank=rank)
        self.engine = WeightTransferTrainerFactory.trainer_init(info, client=client, source=LearnerSource())

    def send(self, version: int) -> None:
        self.engine.send_weights()  # the version label is the engine client's (Transferred)


class _FanOut:
    """vLLM's weight-sync client protocol over several servers: each call goes to all at once (they block in
    the same NCCL collectives), and each server's workers get their own ranks after the learner's rank 0."""

    def __init__(self, clients: list[Any], gpus: int):
        self.clients, self.gpus = clients, gpus

    def _all(self, call: Callable[[int, Any], Any]) -> None:
        with ThreadPoolExecutor(max_workers=len(self.clients)) as pool:
            for f in [pool.submit(call, i, c) for i, c in enumerate(self.clients)]:
                f.result()

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._all(lambda i, c: c.init_weight_transfer_engine({**init_info, "rank_offset": 1 + i * self.gpus}))

    def shutdown_weight_transfer_engine(self) -> None:
        self._all(lambda i, c: c.shutdown_weight_transfer_engine())

    def start_weight_update(self) -> None:
        self._all(lambda i, c: c.start_weight_update())

    def update_weights(self, update_info: Any) -> None:
        self._all(lambda i, c: c.update_weights(update_info))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._all(lambda i, c: c.finish_weight_update(weight_version))


class _SGLangPush:
    """SGLang's distributed update: rank 0 joins a torch.distributed NCCL group with every server's GPUs."""

    def __init__(self, urls, gpus, rank, host, port, weights, meta, timeout_s):
        self.urls, self.rank, self.weights, self.timeout_s = urls, rank, weights, timeout_s
        self.meta = meta_fields(meta)
        self.group = None
        if rank == 0:
            world = 1 + gpus * len(urls)
            self.group = asyncio.run(self._both(
                lambda: trainer_group(host, port, world, GROUP_NAME),
                lambda c, i: c.init_weights_group(host, port, 1 + i * gpus, world, GROUP_NAME)))

    def send(self, version: int) -> None:
        if self.rank != 0:
            for _ in self.weights():  # take part in the gathers only
                pass
            return
        asyncio.run(self._both(lambda: broadcast(self.group, self.weights()),
                               lambda c, i: c.update_weights_from_distributed(self.meta, GROUP_NAME, version)))

    async def _both(self, local: Callable[[], Any], remote: Callable[[Any, int], Any]) -> Any:
        """`local` (rank 0's side, in a thread) and `remote` on every server at once: both meet in NCCL."""
        from serving.remote.sglang import SGLangEngine

        clients = [SGLangEngine(u, None, request_timeout_s=self.timeout_s) for u in self.urls]
        thread = ThreadPoolExecutor(max_workers=1)
        try:
            mine = asyncio.get_running_loop().run_in_executor(thread, local)
            await asyncio.gather(*(remote(c, i) for i, c in enumerate(clients)))
            return await mine
        finally:
            # never join rank 0's thread after a server failed: it waits in an NCCL call no peer will reach (the
            # run stops with the server's error; the group is unusable either way)
            thread.shutdown(wait=False)
            await asyncio.gather(*(c.aclose() for c in clients), return_exceptions=True)
