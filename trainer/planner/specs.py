"""The planner's inputs: GPU catalog, cluster, model and workload, each a YAML file mapped onto a dataclass.

Units everywhere: bytes, seconds, FLOP/s; YAML fields carry their unit in the name (`hbm_gb`, `hbm_tbps`,
`bf16_tflops`, `nic_gbps` in GB/s). Unknown keys are errors that list the valid ones.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

CATALOG = Path(__file__).resolve().parents[2] / "configs" / "planner" / "gpus.yaml"
"""The shipped GPU catalog (datasheet figures, sources named per entry)."""


class SpecError(ValueError):
    """A planner input file is missing, malformed, or names an unknown key or GPU type."""


@dataclass
class MeasuredSpeed:
    """Speeds measured on a device for one model (`hexsearch plan profile`); they replace the roofline."""

    model: str = ""
    """Model the figures were measured with (they apply only to a model of this name)."""
    decode_base_s: float = 0.0
    """Seconds of one decode step at batch 1: t_step(b) = decode_base_s + decode_per_seq_s * (b - 1)."""
    decode_per_seq_s: float = 0.0
    """Extra seconds per decode step for every further sequence in the batch."""
    prefill_tokens_per_s: float = 0.0
    """Prompt tokens per second of prefill."""
    train_tokens_per_s: float = 0.0
    """Tokens per second of training (forward, backward; pi_prox included as configured), counted beyond the
    prefix all sequences of a step share (`shared_prefix_tokens`): the learner computes that prefix once per step,
    and `train_fixed_s` holds it."""
    train_fixed_s: float = 0.0
    """Seconds of a training step that do not grow with its tokens (optimizer step, the step-wide shared prefix)."""
    max_batch: int = 0
    """Largest decode batch measured (the planner does not extrapolate beyond it)."""
    weight_sync_s: float = 0.0
    """Seconds of one weight sync to an engine on this device (export, pause, load, resume), added to the
    transfer time the links give."""


@dataclass
class GpuType:
    hbm_gb: float = 0.0
    """Device memory in GB (1e9 bytes)."""
    hbm_tbps: float = 0.0
    """Peak memory bandwidth in TB/s."""
    bf16_tflops: float = 0.0
    """Peak dense (no sparsity) bf16 tensor throughput in TFLOP/s."""
    price_per_hour: float = 0.0
    """Price of one device per hour in dollars."""
    intra_node_gbps: float = 0.0
    """Bandwidth per device to the other devices of its node in GB/s (NVLink, or PCIe where there is none)."""
    source: str = ""
    """Where the figures come from (datasheet, whitepaper, measurement)."""
    price_source: str = ""
    """Where the price comes from."""
    measured: MeasuredSpeed | None = None
    """Measured speeds for one model; when set and the model matches, they replace the roofline figures."""
    cpu: bool = False
    """A CPU core, not a GPU (a device written by `hexsearch plan profile`): actors placed on it ask Ray for
    `num_cpus` instead of `num_gpus`."""


@dataclass
class NodePool:
    name: str = ""
    """Pool name; nodes are named `<name>-<i>`."""
    gpu: str = ""
    """GPU type (a key of the catalog or of the cluster's own `gpus`)."""
    nodes: int = 1
    """Number of identical nodes."""
    gpus_per_node: int = 8
    """Devices per node."""
    nic_gbps: float = 50.0
    """Inter-node bandwidth per device in GB/s (e.g. one 400 Gb/s NIC per GPU = 50)."""
    rack: str = ""
    """Rack or switch domain; traffic between racks runs at the cluster's `inter_rack_gbps`. Empty: the pool name."""


@dataclass
class Cluster:
    catalog: str = ""
    """GPU catalog YAML, relative to this file. Empty: the shipped configs/planner/gpus.yaml."""
    gpus: dict[str, GpuType] = field(default_factory=dict)
    """Extra or overriding GPU types (e.g. a device written by `hexsearch plan profile`)."""
    pools: list[NodePool] = field(default_factory=list)
    """Groups of identical nodes."""
    inter_rack_gbps: float = 25.0
    """Bandwidth per device between racks in GB/s (also between pools in different racks)."""


@dataclass
class ModelSpec:
    name: str = ""
    """Model name (matched against a measured device entry's `model`)."""
    params_b: float = 0.0
    """Parameters in billions."""
    layers: int = 0
    """Transformer layers."""
    hidden: int = 0
    """Hidden size."""
    kv_bytes_per_token: float = 0.0
    """KV-cache bytes per token: 2 (K and V) x layers x kv_heads x head_dim x bytes per element."""
    bytes_per_param: float = 2.0
    """Bytes per parameter of the weights engines hold and weight sync sends (2 for bf16)."""
    vocab: int = 0
    """Vocabulary size (the learner's fp32 logits; 0: the logits term is left out)."""
    intermediate: int = 0
    """MLP (intermediate) size (a layer's activations; 0: 4 x hidden)."""
    tied_embeddings: bool = False
    """The lm_head shares the input embeddings (one vocab x hidden matrix instead of two)."""


@dataclass
class WorkloadSpec:
    prompt_tokens: float = 512.0
    """Mean prompt tokens per trajectory (system prompt + question)."""
    shared_prefix_tokens: float = 0.0
    """Leading prompt tokens every trajectory shares (system prompt, worked example): an engine's prefix cache
    prefills them once, so they cost no prefill per trajectory."""
    response_tokens_mean: float = 1024.0
    """Mean tokens the policy generates per trajectory, all turns together."""
    response_tokens_p99: float = 4096.0
    """99th percentile of generated tokens per trajectory (log-normal fit with the mean; equal to the mean:
    every trajectory has the same length)."""
    turns: int = 1
    """LLM calls per trajectory (agent turns); each after the first follows a tool call."""
    tool_tokens_per_turn: float = 0.0
    """Tokens a tool result adds to the context per turn (prefilled, trained on with loss mask 0)."""
    tool_latency_median_s: float = 0.0
    """Median seconds of one tool call (log-normal with the p99)."""
    tool_latency_p99_s: float = 0.0
    """99th percentile seconds of one tool call."""
    trained_fraction: float = 1.0
    """Fraction of a step's trajectories that reach the loss: dynamic filtering (`train.filter_groups=drop`) leaves
    out groups whose rewards are all equal, and the learner skips their compute."""
    batch_size: int = 64
    """Questions (groups) per training step (`train.batch_size`)."""
    group_size: int = 8
    """Trajectories per question (`train.group_size`)."""
    max_staleness: int = 4
    """Most weight versions a trained sample may lag (`train.max_staleness`)."""
    max_inflight_trajectories: int = 0
    """Most trajectories in flight (`train.max_inflight_trajectories`; 0: only the staleness bound limits it)."""


def lognormal_sigma(median_or_mean: float, p99: float, from_mean: bool) -> float:
    """sigma of a log-normal with the given p99 and median (or mean): p99 = median * exp(2.326 sigma);
    with the mean, mean = median * exp(sigma^2 / 2), solved for sigma (0 when p99 <= the centre)."""
    if p99 <= median_or_mean or median_or_mean <= 0:
        return 0.0
    z, r = 2.326, math.log(p99 / median_or_mean)
    if not from_mean:
        return r / z
    # log(p99/mean) = z s - s^2/2  ->  s = z - sqrt(z^2 - 2 r)  (smaller root; capped where no root exists)
    return z - math.sqrt(max(z * z - 2 * r, 0.0))


T = TypeVar("T")


def load_spec(path: str | Path, cls: type[T], section: str = "") -> T:
    """A YAML file (or one top-level `section` of it) as dataclass `cls`; unknown keys list the valid ones."""
    path = Path(path)
    if not path.exists():
        raise SpecError(f"{cls.__name__} file not found: {path}")
    try:
        node = OmegaConf.load(path)
    except Exception as e:
        raise SpecError(f"{path}: not valid YAML: {e}") from e
    if section:
        if not isinstance(node, DictConfig) or section not in node:
            raise SpecError(f"{path}: no top-level '{section}' section")
        node = node[section]
    return spec_from(node, cls, str(path))


def spec_from(node: Any, cls: type[T], source: str) -> T:
    """Merge a mapping onto the dataclass `cls`, explaining unknown keys and wrong types."""
    plain = OmegaConf.to_container(node) if isinstance(node, DictConfig) else node
    _check_keys(plain, cls, source, "")
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), plain))  # type: ignore[return-value]
    except OmegaConfBaseException as e:
        raise SpecError(f"{source}: bad value for '{getattr(e, 'full_key', '')}': {str(e).splitlines()[0]}") from None


def _check_keys(node: Any, cls: Any, source: str, prefix: str) -> None:
    """Raise on the first key that is not a field of the dataclass it falls in (through lists and dicts)."""
    if not (isinstance(node, dict) and dataclasses.is_dataclass(cls)):
        return
    hints = typing.get_type_hints(cls)
    for key, value in node.items():
        if key not in hints:
            valid = ", ".join(sorted(f.name for f in dataclasses.fields(cls)))
            raise SpecError(f"{source}: unknown key '{prefix}{key}'. Valid keys here: {valid}")
        tp = hints[key]
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if typing.get_origin(tp) is list and isinstance(value, list):
            for i, item in enumerate(value):
                _check_keys(item, args[0], source, f"{prefix}{key}[{i}].")
        elif typing.get_origin(tp) is dict and isinstance(value, dict):
            for k, item in value.items():
                _check_keys(item, args[-1], source, f"{prefix}{key}.{k}.")
        else:
            _check_keys(value, args[0] if args and typing.get_origin(tp) is not None else tp, source, f"{prefix}{key}.")


def load_cluster(path: str | Path) -> tuple[Cluster, dict[str, GpuType]]:
    """The cluster and the GPU types it may use (catalog, then the cluster's own `gpus` on top)."""
    cluster = load_spec(path, Cluster)
    catalog_path = (Path(path).parent / cluster.catalog) if cluster.catalog else CATALOG
    types = load_catalog(catalog_path)
    types.update(cluster.gpus)
    if not cluster.pools:
        raise SpecError(f"{path}: no 'pools' (groups of nodes) given")
    for pool in cluster.pools:
        if pool.gpu not in types:
            raise SpecError(f"{path}: pool '{pool.name}' uses GPU type '{pool.gpu}', not in the catalog "
                            f"({catalog_path}) or the cluster's gpus. Known types: {', '.join(sorted(types))}")
        if pool.nodes < 1 or pool.gpus_per_node < 1:
            raise SpecError(f"{path}: pool '{pool.name}' needs nodes >= 1 and gpus_per_node >= 1")
    return cluster, types


def load_catalog(path: str | Path) -> dict[str, GpuType]:
    """GPU types of a catalog YAML (`gpus: {NAME: {...}}`)."""
    node = OmegaConf.load(path) if Path(path).exists() else None
    if not isinstance(node, DictConfig) or "gpus" not in node:
        raise SpecError(f"{path}: not a GPU catalog (needs a top-level 'gpus' mapping)")
    return {str(name): spec_from(entry, GpuType, f"{path}: gpus.{name}") for name, entry in node.gpus.items()}


def gpu_counts(cluster: Cluster) -> dict[str, int]:
    """Devices per GPU type over all pools."""
    counts: dict[str, int] = {}
    for pool in cluster.pools:
        counts[pool.gpu] = counts.get(pool.gpu, 0) + pool.nodes * pool.gpus_per_node
    return counts
