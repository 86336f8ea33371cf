"""A checkpoint's trained policy as a Hugging Face model folder (what `hexsearch export` writes).

    folder = export_policy(checkpoint_dir, base_model, out, lora=(r, alpha, modules) or None, adapter=False)
    folder = export_run(run_or_checkpoint, out)   # the same from a run folder: its config names model and LoRA

A checkpoint (trainer/checkpoint.py) holds the trainable weights next to the optimizer state: in
`learner/` (torch.distributed.checkpoint shards with JSON metadata, trainer/learner_state.py) or, from
earlier versions, in `learner.pt` (read with `weights_only=True` and memory-mapped, so the optimizer's
moments are never read into memory). Only the weights are taken; nothing is unpickled.

The folder holds `model.safetensors`, `config.json`, the tokenizer with its chat template,
`generation_config.json` and `hexsearch_export.json` (the run, step and base model it came from). With
LoRA the adapters are merged into the base weights (`W + alpha/r * B @ A`), so the folder is a plain
model that `engine.model=<folder>`, `hexsearch serve vllm` and the Hub take; `adapter=True` instead
writes a peft adapter folder (`adapter_config.json`, `adapter_model.safetensors`) plus the tokenizer.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
import warnings
from pathlib import Path
from typing import Any

import torch

WEIGHT_PREFIX = "model."
"""Trainable weights are stored as `model.<parameter name>` in the sharded format."""


EXPORT_MARK = "hexsearch_export.json"
"""The file an exported folder carries: its checkpoint, base model, format and dtype."""


class ExportError(ValueError):
    """A checkpoint that cannot be exported (missing files, weights that do not fit the base model)."""


def run_config(run: Path) -> dict:
    """A run folder's config.yaml as a dict."""
    import yaml

    try:
        cfg = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise ExportError(f"{run}: no readable config.yaml ({e})") from None
    return cfg if isinstance(cfg, dict) else {}


def run_lora(cfg: dict) -> tuple[int, float, list[str]] | None:
    """(rank, alpha, modules) of a run config's LoRA settings, None when it trained all weights."""
    t = cfg.get("train") or {}
    if int(t.get("lora_rank") or 0) <= 0:
        return None
    return int(t["lora_rank"]), float(t.get("lora_alpha", 32.0)), list(t.get("lora_modules") or [])


def find_checkpoint(path: str | Path) -> tuple[Path, Path]:
    """(run folder, newest valid checkpoint) of a run folder or of one `step-N` checkpoint folder."""
    from trainer import checkpoint

    p = Path(path)
    if (p / "state.json").exists():  # a checkpoint folder: runs/<run>/checkpoints/step-N
        problem = checkpoint.verify(p)
        if problem:
            raise ExportError(f"{p}: not a valid checkpoint ({problem})")
        return p.parent.parent, p
    if not (p / "config.yaml").exists():
        raise ExportError(f"{p}: not a run folder (no config.yaml) nor a checkpoint folder (no state.json)")
    ckpt = checkpoint.latest(p / "checkpoints")
    if ckpt is None:
        raise ExportError(f"{p}: no valid checkpoint under {p / 'checkpoints'} (was it trained with train.save_every > 0?)")
    return p, ckpt


def export_run(path: str | Path, out: str | Path, *, adapter: bool = False, dtype: str = "bfloat16") -> Path:
    """Export a run's (or a checkpoint's) policy to `out`, written whole or not at all: the base model and
    LoRA settings come from the run's config.yaml."""
    run, ckpt = find_checkpoint(path)
    cfg = run_config(run)
    model = (cfg.get("engine") or {}).get("model")
    if not model:
        raise ExportError(f"{run}/config.yaml names no engine.model")
    lora = run_lora(cfg)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ExportError(f"{out} exists and is not empty")
    tmp = out.with_name(f".{out.name}.tmp-{uuid.uuid4().hex[:6]}")
    try:
        export_policy(ckpt, model, tmp, lora=lora, adapter=adapter, dtype=dtype,
                      info={"run": str(run.resolve()), "step": ckpt.name})
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def read_trained_weights(checkpoint: str | Path) -> dict[str, torch.Tensor]:
    """The trainable weights of a checkpoint folder, by parameter name (no optimizer state)."""
    folder = Path(checkpoint)
    if (folder / "learner.json").exists() and (folder / "learner").is_dir():
        import torch.distributed.checkpoint as dcp

        from trainer.learner_state import _JsonReader

        reader = _JsonReader(folder / "learner")
        saved = reader.read_metadata().state_dict_metadata
        tensors = {k: torch.zeros(tuple(m.size), dtype=m.properties.dtype)
                   for k, m in saved.items() if k.startswith(WEIGHT_PREFIX)}
        if not tensors:
            raise ExportError(f"{folder}: the checkpoint holds no weights")
        with warnings.catch_warnings():  # "torch.distributed is disabled ... single process": that is the intent
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(tensors, storage_reader=reader)
        return {k[len(WEIGHT_PREFIX):]: v for k, v in tensors.items()}
    if (folder / "learner.pt").exists():
        state = torch.load(folder / "learner.pt", map_location="cpu", weights_only=True, mmap=True)
        params = state.get("params") if isinstance(state, dict) else None
        if not isinstance(params, dict) or not params:
            raise ExportError(f"{folder}/learner.pt holds no `params`")
        return {k: v.clone() for k, v in params.items()}
    raise ExportError(f"{folder}: neither learner/ + learner.json nor learner.pt (not a training checkpoint)")


def _merged_model(base_model: str, weights: dict[str, torch.Tensor], lora: tuple[int, float, list[str]] | None):
    from serving.engines.embedded_weights import LoraSpec, LoraState, WeightUpdateError, apply_update
    from serving.models import load_model

    model = load_model(base_model, dtype="float32")
    spec = LoraSpec(lora[0], lora[1]) if lora else None
    try:
        n = apply_update(model, weights, LoraState(), spec)
    except WeightUpdateError as e:
        raise ExportError(f"the checkpoint does not fit {base_model}: {e}") from None
    if n == 0:
        raise ExportError("the checkpoint changed no weight of the base model")
    return model


def _adapter_model(base_model: str, weights: dict[str, torch.Tensor], lora: tuple[int, float, list[str]]):
    from peft import LoraConfig, get_peft_model

    from serving.models import load_model

    model = get_peft_model(load_model(base_model, dtype="float32"), LoraConfig(
        r=lora[0], lora_alpha=lora[1], lora_dropout=0.0, target_modules=list(lora[2])))
    named = dict(model.named_parameters())
    missing = [k for k in weights if k not in named]
    if missing:
        raise ExportError(f"{len(missing)} adapter weight(s) match nothing, e.g. {missing[:2]}")
    with torch.no_grad():
        for k, v in weights.items():
            named[k].copy_(v)
    return model


def export_policy(checkpoint: str | Path, base_model: str, out: str | Path, *, lora: tuple[int, float, list[str]] | None,
                  adapter: bool = False, dtype: str = "bfloat16", info: dict[str, Any] | None = None) -> Path:
    """Write the policy of `checkpoint` (trained from `base_model`) to `out`; see the module docstring."""
    from transformers import GenerationConfig

    from serving.models import load_tokenizer

    if adapter and not lora:
        raise ExportError("--adapter needs a LoRA run (train.lora_rank > 0); this run trained all weights")
    weights = read_trained_weights(checkpoint)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype]
    if adapter:
        model = _adapter_model(base_model, weights, lora)
        model.save_pretrained(out, safe_serialization=True)
        base = model.get_base_model()
    else:
        base = model = _merged_model(base_model, weights, lora).to(torch_dtype)
        model.save_pretrained(out, safe_serialization=True)
    if not (out / "generation_config.json").exists():
        gen = getattr(base, "generation_config", None) or GenerationConfig.from_model_config(base.config)
        gen.save_pretrained(out)
    tokenizer = load_tokenizer(base_model)
    tokenizer.save_pretrained(out)
    if not getattr(tokenizer, "chat_template", None):
        raise ExportError(f"the tokenizer of {base_model} has no chat template to export")
    (out / EXPORT_MARK).write_text(json.dumps({
        "checkpoint": str(Path(checkpoint).resolve()), "base_model": base_model, "format": "adapter" if adapter else "merged",
        "lora": list(lora[:2]) if lora else None, "dtype": dtype, "weights": len(weights), **(info or {})}, indent=2))
    return out
