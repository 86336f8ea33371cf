"""Weight updates for the embedded engine: state dicts, checkpoint folders, and LoRA adapters.

An update is a mapping name -> tensor. It may hold every tensor of the model or only some (a trainer
that tunes a subset, or LoRA weights it merged itself); tensors not named keep their values. Names are
normalised so that what trainers naturally produce loads unchanged:

    base_model.model.<name>             peft prefix        -> <name>
    <module>.base_layer.weight          peft base weight   -> <module>.weight (the un-merged base)
    module.<name> / _orig_mod.<name>    DDP / torch.compile prefixes
    <module>.lora_A[.adapter].weight    LoRA factor A      \\  merged:  W = W_base + s * B @ A
    <module>.lora_B[.adapter].weight    LoRA factor B      /  s = alpha / r  (alpha / sqrt(r) with rsLoRA)

The engine always runs a plain (merged) model, because the peft wrapper costs ~25-30% of decoding speed
on CPU. To re-merge adapters on every update it keeps a copy of the un-merged base weight of each module
that ever received a LoRA factor.

A folder is either an HF checkpoint (`*.safetensors`, else `*.bin`) or a peft adapter folder
(`adapter_config.json` + `adapter_model.safetensors`, which also gives alpha and r).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

_PREFIXES = ("base_model.model.", "module.", "_orig_mod.")
_LORA = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[AB])(?:\.[^.]+)?\.weight$")


class WeightUpdateError(ValueError):
    """A weight source that does not fit the served model (unknown names, wrong shapes, missing files)."""


@dataclass
class LoraSpec:
    """How LoRA factors scale when merged: s = alpha / r, or alpha / sqrt(r) with rsLoRA."""

    r: int
    alpha: float
    use_rslora: bool = False

    @property
    def scaling(self) -> float:
        return self.alpha / (math.sqrt(self.r) if self.use_rslora else self.r)

    @classmethod
    def from_peft_config(cls, cfg) -> LoraSpec:
        get = cfg.get if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
        return cls(int(get("r")), float(get("lora_alpha")), bool(get("use_rslora", False)))


@dataclass
class LoraState:
    """What the engine remembers to re-merge adapters: their scaling and the un-merged base weights."""

    spec: LoraSpec | None = None
    base: dict[str, torch.Tensor] = field(default_factory=dict)
    """Weight name (`<module>.weight`) -> un-merged base weight."""


def _strip(name: str) -> str:
    changed = True
    while changed:
        changed = False
        for p in _PREFIXES:
            if name.startswith(p):
                name, changed = name[len(p):], True
    return name.replace(".base_layer.", ".")


def read_folder(path: str | Path) -> tuple[dict[str, torch.Tensor], LoraSpec | None]:
    """Tensors of a checkpoint or adapter folder, plus the LoRA spec when it is an adapter folder."""
    folder = Path(path)
    if not folder.is_dir():
        raise WeightUpdateError(f"weight folder {folder} does not exist")
    spec = None
    if (folder / "adapter_config.json").exists():
        spec = LoraSpec.from_peft_config(json.loads((folder / "adapter_config.json").read_text()))
    files = sorted(folder.glob("*.safetensors"))
    state: dict[str, torch.Tensor] = {}
    if files:
        from safetensors.torch import load_file

        for f in files:
            state.update(load_file(str(f)))
    else:
        bins = sorted(folder.glob("*.bin"))
        if not bins:
            raise WeightUpdateError(f"weight folder {folder} has no *.safetensors or *.bin files")
        for f in bins:
            state.update(torch.load(f, map_location="cpu", weights_only=True))
    return state, spec


def capture_peft(peft_model) -> tuple[torch.nn.Module, LoraState]:
    """Merge a peft LoRA model into a plain model, remembering the base weights and the scaling.

    The peft model is copied first: the trainer keeps training its own (un-merged) copy.
    """
    import copy

    wrapped = copy.deepcopy(peft_model)
    cfg = next(iter(wrapped.peft_config.values()))
    state = LoraState(spec=LoraSpec.from_peft_config(cfg))
    for name, tensor in wrapped.state_dict().items():
        if ".base_layer." in name:
            state.base[_strip(name)] = tensor.detach().clone()
    return wrapped.merge_and_unload(), state


def apply_update(model: torch.nn.Module, update: dict[str, torch.Tensor], lora: LoraState,
                 spec: LoraSpec | None = None) -> int:
    """Copy an update into `model` in place (see the module docstring). Returns the number of tensors set.

    Everything is validated before the first tensor is written, so a bad update changes nothing.
    """
    params = dict(model.state_dict(keep_vars=True))
    plain: dict[str, torch.Tensor] = {}
    bases: dict[str, torch.Tensor] = {}
    factors: dict[str, dict[str, torch.Tensor]] = {}
    unknown: list[str] = []
    for raw, tensor in update.items():
        name = _strip(raw)
        m = _LORA.match(name)
        if m:
            factors.setdefault(m["module"] + ".weight", {})[m["which"]] = tensor
        elif name not in params:
            unknown.append(raw)
        elif ".base_layer." in raw:
            bases[name] = tensor
        else:
            plain[name] = tensor
    if unknown:
        raise WeightUpdateError(
            f"{len(unknown)} tensor name(s) match nothing in the served model, e.g. {unknown[:3]}; "
            f"expected names like {list(params)[:2]}")
    for name, tensor in [*plain.items(), *bases.items()]:
        if tuple(tensor.shape) != tuple(params[name].shape):
            raise WeightUpdateError(f"tensor '{name}' has shape {tuple(tensor.shape)}, the model has "
                                    f"{tuple(params[name].shape)}")
    merged: dict[str, torch.Tensor] = {}
    if factors:
        spec = spec or lora.spec
        if spec is None:
            raise WeightUpdateError(
                "the update holds LoRA factors (lora_A/lora_B) but their scaling is unknown: build the engine "
                "from the PeftModel, send a peft adapter folder (adapter_config.json), or send merged weights")
        for name, pair in factors.items():
            if name not in params or set(pair) != {"A", "B"}:
                raise WeightUpdateError(f"LoRA factors for '{name}' need both lora_A and lora_B of a model weight")
            base = bases.get(name, lora.base.get(name, params[name].detach()))
            delta = pair["B"].float() @ pair["A"].float()
            if tuple(delta.shape) != tuple(base.shape):
                raise WeightUpdateError(f"LoRA factors for '{name}' give shape {tuple(delta.shape)}, the model "
                                        f"has {tuple(base.shape)}")
            merged[name] = base.float().to(delta.device) + spec.scaling * delta
    with torch.no_grad():
        for name, tensor in bases.items():  # new un-merged base weights (peft state dicts carry them)
            lora.base[name] = tensor.detach().to(params[name].dtype).clone()
            if name not in factors and name not in plain:
                merged[name] = lora.base[name] + 0  # no adapter sent for it: serve base + nothing
        for name in factors:
            lora.base.setdefault(name, params[name].detach().clone())
        if factors:
            lora.spec = spec
        for name, tensor in plain.items():  # weights to serve as they are (e.g. merged by the trainer)
            params[name].copy_(tensor)
        for name, tensor in merged.items():
            params[name].copy_(tensor)
    return len(plain) + len(merged)
