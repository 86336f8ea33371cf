"""The learner's part of a checkpoint: `torch.distributed.checkpoint` shards and JSON, nothing pickled.

    <checkpoint>/learner/             a torch.distributed.checkpoint folder: each rank writes its own shards
        __<rank>_0.distcp               (raw tensor bytes; replicated tensors are written once)
        .metadata.json                  which chunk of which tensor lies where: JSON, written by rank 0
    <checkpoint>/learner.json         optimizer hyper-parameters, LR schedule, torch RNG, strategy and ranks

Tensors are named `model.<param>` (the trainable weights, full or sharded) and `optim.<param>.<state>`
(AdamW's `exp_avg`, `exp_avg_sq`, `step`) by parameter name, never by position, so DCP reshards on load:
a checkpoint written by 2 fsdp2 ranks resumes on 1 plain learner, on 2 ddp ranks, on 4 fsdp2 ranks.

DCP's own FileSystemWriter/Reader keep the metadata as a pickle and store non-tensor values with
torch.save; here the metadata is JSON (`_JsonWriter`, `_JsonReader`), only tensors go through DCP (read
back with `weights_only=True` by DCP itself), everything else is JSON. Checkpoints of earlier versions
(`learner.pt`, loaded with `weights_only=True`) still resume on a plain or ddp learner.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

SHARDS, META, STATE = "learner", ".metadata.json", "learner.json"
_IMPL_FLAGS = ("params", "fused", "foreach", "capturable", "differentiable")
"""Optimizer param-group keys that describe the implementation, not the run: kept from the resuming learner."""


def _encode(md: Metadata, storage: dict[MetadataIndex, _StorageInfo]) -> dict[str, Any]:
    tensors = {}
    for fqn, m in md.state_dict_metadata.items():
        if not isinstance(m, TensorStorageMetadata):
            raise TypeError(f"{fqn}: only tensors go into the learner's shards, not {type(m).__name__}")
        tensors[fqn] = {"dtype": str(m.properties.dtype).removeprefix("torch."), "size": list(m.size),
                        "chunks": [[list(c.offsets), list(c.sizes)] for c in m.chunks]}
    items = [{"fqn": i.fqn, "offset": None if i.offset is None else list(i.offset), "index": i.index,
              "path": s.relative_path, "at": s.offset, "length": s.length,
              "transforms": list(s.transform_descriptors or [])} for i, s in storage.items()]
    planner = {k: list(v) for k, v in (md.planner_data or {}).items()}
    return {"version": md.version, "tensors": tensors, "storage": items, "planner": planner}


def _decode(doc: dict[str, Any]) -> Metadata:
    tensors = {fqn: TensorStorageMetadata(TensorProperties(dtype=getattr(torch, t["dtype"])), torch.Size(t["size"]),
                                          [ChunkStorageMetadata(torch.Size(o), torch.Size(s)) for o, s in t["chunks"]])
               for fqn, t in doc["tensors"].items()}
    storage = {MetadataIndex(i["fqn"], i["offset"], i["index"]):
               _StorageInfo(i["path"], i["at"], i["length"], i["transforms"] or None) for i in doc["storage"]}
    return Metadata(tensors, planner_data={k: tuple(v) for k, v in doc["planner"].items()}, storage_data=storage,
                    storage_meta=StorageMeta(), version=doc["version"])


class _JsonWriter(FileSystemWriter):
    """DCP's file-system writer with the metadata written as JSON (fsynced, then renamed into place)."""

    def finish(self, metadata: Metadata, results: list[list[Any]]) -> None:
        storage = {wr.index: wr.storage_data for part in results for wr in part}
        tmp = Path(self.path) / f"{META}.tmp"
        with tmp.open("w") as f:
            json.dump(_encode(metadata, storage), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, Path(self.path) / META)


class _JsonReader(FileSystemReader):
    """DCP's file-system reader that reads the JSON metadata (and never a pickled `.metadata`)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        md = _decode(json.loads((Path(self.path) / META).read_text()))
        md.storage_meta.load_id = self.load_id
        return md


def _trainable(learner: Any) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in learner.model.named_parameters() if p.requires_grad}


@contextlib.contextmanager
def _single_process_ok():
    """DCP warns on every save/load by a learner without a process group (one rank): that is intended here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def save(learner: Any, folder: str | Path) -> None:
    """Every rank calls this: its shards go to `<folder>/learner/`; rank 0 also writes learner.json."""
    folder = Path(folder)
    tensors: dict[str, torch.Tensor] = {}
    for name, p in _trainable(learner).items():
        tensors[f"model.{name}"] = p.detach()
        for key, value in learner.optimizer.state.get(p, {}).items():
            if torch.is_tensor(value):
                tensors[f"optim.{name}.{key}"] = value
    with _single_process_ok():
        dcp.save(tensors, storage_writer=_JsonWriter(folder / SHARDS, sync_files=True))
    if learner.rank != 0:
        return
    groups = [{k: v for k, v in g.items() if k not in _IMPL_FLAGS} for g in learner.optimizer.param_groups]
    state = {"format": 1, "strategy": learner.strategy.name, "ranks": learner.world_size, "param_groups": groups,
             "scheduler": learner.scheduler.state_dict(), "torch_rng": torch.get_rng_state().tolist()}
    path = folder / STATE
    with path.open("w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())


def _load_legacy(learner: Any, state: dict[str, Any]) -> None:
    """A `learner.pt` of an earlier hexsearch: {params, optimizer, scheduler, torch_rng} of one full replica."""
    named = dict(learner.model.named_parameters())
    with torch.no_grad():
        for n, v in state["params"].items():
            named[n].copy_(v)
    learner.optimizer.load_state_dict(state["optimizer"])
    learner.scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])


def load(learner: Any, folder: str | Path) -> None:
    """Every rank calls this: weights and optimizer moments resharded onto this learner's ranks."""
    folder = Path(folder)
    if not (folder / STATE).exists() and (folder / "learner.pt").exists():  # an earlier hexsearch wrote it
        if learner.strategy.sharded:
            raise ValueError(f"{folder}/learner.pt predates sharded checkpoints: resume it with "
                             "train.learner.strategy=ddp, then switch to fsdp2 at the next checkpoint")
        _load_legacy(learner, torch.load(folder / "learner.pt", weights_only=True))
        return
    state = json.loads((folder / STATE).read_text())
    reader = _JsonReader(folder / SHARDS)
    saved = reader.read_metadata().state_dict_metadata
    fused = bool(learner.optimizer.defaults.get("fused"))
    tensors: dict[str, torch.Tensor] = {}
    moments: dict[str, dict[str, torch.Tensor]] = {}
    for name, p in _trainable(learner).items():
        if f"model.{name}" not in saved:
            raise KeyError(f"{folder}: the checkpoint has no weight {name!r} (another model or LoRA setting?)")
        tensors[f"model.{name}"] = p.detach()  # loaded in place (this rank's shard under fsdp2)
        prefix = f"optim.{name}."
        for key in (k[len(prefix):] for k in saved if k.startswith(prefix) and "." not in k[len(prefix):]):
            meta = saved[f"optim.{name}.{key}"]
            t = (torch.zeros_like(p, dtype=meta.properties.dtype) if tuple(meta.size) == tuple(p.shape)
                 else torch.zeros(meta.size, dtype=meta.properties.dtype, device=p.device if fused else "cpu"))
            tensors[f"optim.{name}.{key}"] = moments.setdefault(name, {})[key] = t
    with _single_process_ok():
        dcp.load(tensors, storage_reader=reader)
    named = _trainable(learner)
    for name, moment in moments.items():
        learner.optimizer.state[named[name]] = moment
    for group, saved_group in zip(learner.optimizer.param_groups, state["param_groups"], strict=True):
        group.update({k: tuple(v) if k == "betas" else v for k, v in saved_group.items()})
    learner.scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))
