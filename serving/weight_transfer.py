"""Weight updates of remote servers without a full checkpoint on disk (GPU servers; see docs/scale-out.md).

    adapter (vLLM)   LoRA runs: the learner saves only the adapter (PEFT `save_pretrained`:
                     adapter_config.json + adapter_model.safetensors, a few MB instead of the model) and the
                     server loads it under a new name, `policy-v<version>`:
                         POST /v1/load_lora_adapter   {"lora_name", "lora_path"}
                         POST /v1/unload_lora_adapter {"lora_name": <the previous one>}
                     generate requests then name the adapter as their model. The server must run with
                     `--enable-lora --max-lora-rank <r>` and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True
                     (`hexsearch train` starts its managed vLLM servers so). `train.weight_transfer=adapter`.
    nccl (SGLang)    learner rank 0 and every GPU of every server form one NCCL group (rank 0 = learner,
                     server i's GPUs from `rank_offset`): once, POST /init_weights_update_group
                     {"master_address", "master_port", "rank_offset", "world_size", "group_name", "backend"}
                     on each server while rank 0 joins with `trainer_group`; per sync, POST
                     /update_weights_from_distributed {"names", "dtypes", "shapes", "group_name",
                     "flush_cache", "weight_version"} while rank 0 `broadcast`s the tensors in that order.
                     The building blocks are here; the training loop does not drive them yet (the loop's
                     remote path is the checkpoint folder), docs/scale-out.md says what is left.

vLLM's NCCL weight transfer (/init_weight_transfer_engine, /start_weight_update, /update_weights,
/finish_weight_update) needs vLLM's trainer-side engine in the learner's process, which the learner's
environment does not have; remote vLLM servers take full updates from disk, LoRA updates as adapters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ADAPTER_FILE = "adapter_config.json"


def is_adapter_dir(path: str | Path) -> bool:
    """A folder holding a PEFT adapter (not a whole model)."""
    return (Path(path) / ADAPTER_FILE).is_file()


def adapter_name(version: int) -> str:
    return f"policy-v{version}"


def wire_meta(tensors: dict[str, Any]) -> dict[str, list]:
    """Names, dtypes (`bfloat16`, ...) and shapes of the tensors, in broadcast order (SGLang's request fields)."""
    names = list(tensors)
    return {"names": names, "dtypes": [str(tensors[n].dtype).removeprefix("torch.") for n in names],
            "shapes": [list(tensors[n].shape) for n in names]}


def trainer_group(master_address: str, master_port: int, world_size: int, group_name: str) -> Any:
    """Learner rank 0's side of the update group (rank 0): an NCCL process group over a TCP store that rank 0
    hosts, prefixed by `group_name` the way torch.distributed names a group, which is how SGLang's
    `init_custom_process_group` joins it from the servers. Not the learners' own process group."""
    import torch.distributed as dist

    store = dist.TCPStore(master_address, master_port, world_size, is_master=True)
    return dist.ProcessGroupNCCL(dist.PrefixStore(f"{group_name}/", store), 0, world_size)


def broadcast(group: Any, tensors: dict[str, Any]) -> None:
    """Send every tensor (on the GPU, in `wire_meta` order) from rank 0 to the servers' ranks."""
    import torch.distributed as dist

    for t in tensors.values():
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        group.broadcast([t.cuda().contiguous()], opts).wait()
