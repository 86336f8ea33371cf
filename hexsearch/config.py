"""Config loading: dataclasses are the single source of truth, YAML and `key=value` map onto them.

    cfg = load_config("configs/quickstart.yaml", ["train.lr=1e-5", "agent.max_turns=8"])

Every section is a dataclass owned by its package (`serving.config.EngineConfig`, ...), with a
docstring under each field. OmegaConf structured configs do the merging and type checking; this
module only turns their errors into messages that name the key and list the valid ones.
Fixed-choice fields are `typing.Literal` aliases (checked here at load, and by `core.choices.check_choices`
for dataclasses built in code); numeric ranges are declared on the fields (`core.ranges.ranged`) and
checked here the same way. A YAML file may start with `extends: other.yaml` (path relative to the
file) to inherit a recipe. Keys that were renamed (`RENAMED`) still load, with a warning.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from agent.config import AgentConfig
from core.choices import field_types, item_literal_values, literal_values
from core.log import get_logger
from core.ranges import field_range, range_problem
from core.rundir import RunConfig
from datagen.config import DatagenConfig
from eval.config import EvalConfig
from serving.config import EngineConfig
from tools.config import ToolsConfig
from trainer.config import TrainConfig
from trainer.planner.config import PlanConfig
from trainer.sft_config import SFTConfig
from world.config import WorldConfig

log = get_logger(__name__)

RENAMED = {"agent.reward": "agent.reward_fn", "agent.judge_cache": "agent.judge.cache",
           "train.max_concurrent_rollouts": "train.max_inflight_trajectories",
           "train.max_concurrent_episodes": "train.max_inflight_trajectories",
           "train.tool_latency_median_s": "tools.latency_median_s", "train.tool_latency_p99_s": "tools.latency_p99_s"}
"""Old dotted key -> its new name. An old key in a YAML file or an override is moved to the new one
(with a warning); giving both in one file or on one command line is an error."""


class ConfigError(ValueError):
    """A config problem explained in one line (unknown key, wrong type, missing file)."""


@dataclass
class HexConfig:
    """The whole configuration. Each command reads the sections it needs."""

    run: RunConfig = field(default_factory=RunConfig)
    """Run folder, seed and logging."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """Policy model and inference engine."""
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    """Search, page access and local retrieval tools."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """The search agent: action format, budgets, context policy, reward."""
    world: WorldConfig = field(default_factory=WorldConfig)
    """The offline fictional world (corpus + multi-hop QA)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Asynchronous RL training."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """Supervised fine-tuning on token-exact trajectories (`hexsearch sft`), the cold start before RL."""
    datagen: DatagenConfig = field(default_factory=DatagenConfig)
    """QA synthesis."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation suites and scoring."""
    plan: PlanConfig = field(default_factory=PlanConfig)
    """Heterogeneity-aware placement planner."""


def _valid_keys(node: Any) -> list[str]:
    if dataclasses.is_dataclass(node):
        return [f.name for f in dataclasses.fields(node)]
    if isinstance(node, DictConfig):
        return [str(k) for k in node.keys()]
    return []


def _section(schema: DictConfig, dotted: str) -> Any:
    """The DictConfig that holds the last component of `dotted` (for listing valid keys)."""
    node: Any = schema
    for part in dotted.split(".")[:-1]:
        if isinstance(node, DictConfig) and part in node and isinstance(node[part], DictConfig):
            node = node[part]
        else:
            break
    return node


def _bad_choice(node: Any, cls: Any, prefix: str = "") -> tuple[str, Any, tuple[Any, ...]] | None:
    """(dotted key, value, valid values) of the first Literal field in a plain layer (dicts/lists from
    `OmegaConf.to_container`) whose value is not allowed; walks the layer along the dataclass `cls`."""
    if not (isinstance(node, dict) and dataclasses.is_dataclass(cls)):
        return None
    types = field_types(cls)
    for key, value in node.items():
        tp, dotted = types.get(str(key)), f"{prefix}{key}"
        valid, item_valid = literal_values(tp), item_literal_values(tp)
        if valid is not None:
            if not _interpolation(value) and value not in valid:
                return dotted, value, valid
            continue
        if item_valid is not None:
            for i, item in enumerate(value if isinstance(value, list) else []):
                if not _interpolation(item) and item not in item_valid:
                    return f"{dotted}[{i}]", item, item_valid
            continue
        if typing.get_origin(tp) in (list, dict) and isinstance(value, (list, dict)):
            inner = typing.get_args(tp)[-1]
            items = enumerate(value) if isinstance(value, list) else value.items()
            sep = "[{}]" if isinstance(value, list) else ".{}"
            for k, item in items:
                found = _bad_choice(item, inner, f"{dotted}{sep.format(k)}.")
                if found:
                    return found
        else:
            found = _bad_choice(value, tp, f"{dotted}.")
            if found:
                return found
    return None


def _interpolation(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("${")


def _explain(err: OmegaConfBaseException, schema: DictConfig, source: str, layer: DictConfig | None = None) -> ConfigError:
    key = getattr(err, "full_key", None) or ""
    if isinstance(err, (ConfigKeyError, ConfigAttributeError)):
        where = _section(schema, key) if key else schema
        valid = ", ".join(sorted(_valid_keys(where)))
        return ConfigError(f"{source}: unknown config key '{key}'. Valid keys here: {valid}")
    if isinstance(err, ValidationError):
        bad = _bad_choice(OmegaConf.to_container(layer, resolve=False), HexConfig) if layer is not None else None
        if bad:
            dotted, value, valid = bad
            return ConfigError(f"{source}: bad value for '{dotted}': {value!r} is not one of: "
                               f"{', '.join(map(str, valid))}")
        msg = str(err).splitlines()[0]
        if ":" in key.rsplit(".", 1)[-1]:  # YAML read `{a:1}` as the key "a:1" (flow mappings need ": ")
            msg += "; write a mapping with a space after each colon, e.g. 'train.bucket_weights={hops1: 2, hops2: 4}'"
        return ConfigError(f"{source}: bad value for '{key}': {msg}")
    return ConfigError(f"{source}: {str(err).splitlines()[0]}")


def _rename_keys(layer: DictConfig, source: str) -> DictConfig:
    """The layer with every old key of RENAMED moved to its new name (a warning names the source)."""
    data = OmegaConf.to_container(layer, resolve=False)
    moved = False
    for old, new in RENAMED.items():
        *path, last = old.split(".")
        parent = _dig(data, path)
        if not (isinstance(parent, dict) and last in parent):
            continue
        *new_path, new_last = new.split(".")
        target = _dig(data, new_path, create=True)
        if not isinstance(target, dict):
            raise ConfigError(f"{source}: '{old}' was renamed '{new}', but '{'.'.join(new_path)}' is not a section")
        if new_last in target:
            raise ConfigError(f"{source}: both '{old}' and its new name '{new}' are set; keep only '{new}'")
        target[new_last] = parent.pop(last)
        log.warning("%s: config key '%s' was renamed '%s'; please use the new name", source, old, new)
        moved = True
    return OmegaConf.create(data) if moved else layer


def _dig(data: Any, path: list[str], create: bool = False) -> Any:
    """The node at `path` in nested dicts (created as empty dicts when `create`); None when absent."""
    for part in path:
        if not isinstance(data, dict):
            return None
        if part not in data and create:
            data[part] = {}
        data = data.get(part)
    return data


def _load_yaml(path: Path, seen: tuple[Path, ...] = ()) -> list[tuple[str, DictConfig]]:
    """The YAML file and the files it `extends`, base first."""
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"{path}: 'extends' loop through {', '.join(map(str, seen))}")
    if not path.exists():
        raise ConfigError(f"config file not found: {path}")
    try:
        node = OmegaConf.load(path)
    except Exception as e:  # yaml errors carry line numbers in their text
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(node).__name__}")
    chain: list[tuple[str, DictConfig]] = []
    if "extends" in node:
        base = path.parent / str(node.pop("extends"))
        chain.extend(_load_yaml(base, seen + (path,)))
    chain.append((str(path), node))
    return chain


@functools.lru_cache(maxsize=1)
def _schema() -> DictConfig:
    """The defaults as an OmegaConf schema, built once (building it is most of a load's ~60 ms; a merge copies
    it, so the cached one is never changed)."""
    return OmegaConf.structured(HexConfig)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> HexConfig:
    """Resolve defaults < YAML (with its `extends` chain) < `key=value` overrides into a HexConfig."""
    schema = _schema()
    merged = schema
    layers = _load_yaml(Path(path)) if path else []
    for bad in (o for o in overrides or [] if "=" not in o):
        raise ConfigError(f"override '{bad}' is not of the form key=value (e.g. train.lr=1e-5)")
    if overrides:
        layers.append(("command line", OmegaConf.from_dotlist(list(overrides))))
    for source, layer in layers:
        layer = _rename_keys(layer, source)
        try:
            merged = OmegaConf.merge(merged, layer)
        except OmegaConfBaseException as e:
            raise _explain(e, schema, source, layer) from e
    try:
        cfg: HexConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as e:
        raise _explain(e, schema, "config") from e
    check_components(cfg)
    problem = range_problem(cfg)  # each field's range is declared on it (core.ranges.ranged)
    if problem is not None:
        raise ConfigError(problem)
    from trainer.staleness import concurrency_warnings

    for warning in concurrency_warnings(cfg.train, cfg.engine.max_batch_size):
        log.warning("%s: %s", path or "config", warning)
    return cfg


def check_components(cfg: HexConfig) -> None:
    """Fields that name a component (a built-in name or `package.module:attribute`) name a real one: a
    built-in, or an import path (imported later, inside each worker; syntax is checked here)."""
    from core.registry import ComponentError
    from hexsearch.components import check_components as check_fields

    try:
        check_fields(cfg)  # every field hexsearch/components.py lists, against its registry
    except ComponentError as e:
        raise ConfigError(str(e)) from e
    check_agent_program(cfg)


def check_agent_program(cfg: HexConfig) -> None:
    """`agent.program` / `agent.command` (bring your own agent): at most one, an import path, a list of strings;
    a command's folder is fixed here, where the config loads, so its relative paths hold in Ray workers too."""
    import os

    from core.registry import is_import_path

    a = cfg.agent
    if a.program and a.command:
        raise ConfigError("agent.program and agent.command are exclusive: set one")
    if a.program and not is_import_path(a.program):
        raise ConfigError(f"agent.program: '{a.program}' is not an import path 'package.module:function'")
    if a.command and not all(isinstance(x, str) and x for x in a.command):
        raise ConfigError(f"agent.command must be a list of non-empty strings, got {list(a.command)!r}")
    if cfg.train.workflow == "openai_agent" and not (a.program or a.command):
        raise ConfigError("train.workflow=openai_agent needs agent.program ('package.module:function') or "
                          "agent.command (e.g. [python, my_agent.py])")
    if a.command and not a.command_cwd:
        a.command_cwd = os.getcwd()


def to_yaml(cfg: Any) -> str:
    """The resolved config as YAML (what `hexsearch config show` prints and runs save)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> docstring (the string literal right under the field) of a config dataclass."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for prev, node in zip(body, body[1:], strict=False):
        if (isinstance(prev, ast.AnnAssign) and isinstance(prev.target, ast.Name)
                and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            docs[prev.target.id] = inspect.cleandoc(node.value.value)
    return docs


def describe(cls: type = HexConfig, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, type, docstring) for every leaf field, recursing into nested dataclasses; the type of a
    fixed-choice field is its values, e.g. `drop|reject|none` (`list[search|access]` for a list of them), and
    that of a field naming a component its registry's names; a number's is followed by its range."""
    from hexsearch.components import COMPONENT_FIELDS, component_names

    rows: list[tuple[str, str, str]] = []
    docs = field_docs(cls)
    types = field_types(cls)
    for f in dataclasses.fields(cls):
        choices, items = literal_values(types[f.name]), item_literal_values(types[f.name])
        if f"{prefix}{f.name}" in COMPONENT_FIELDS:  # a registry's names (hexsearch/components.py)
            names = (*component_names(f"{prefix}{f.name}"), "pkg.mod:attr")
            choices, items = (None, names) if typing.get_origin(types[f.name]) is list else (names, None)
        kind = ("|".join(map(str, choices)) if choices else f"list[{'|'.join(map(str, items))}]" if items
                else getattr(f.type, "__name__", str(f.type)))
        if types[f.name] in (int, float):  # the range declared on the field (core.ranges.ranged)
            rng = field_range(f)
            kind = ", ".join(filter(None, (kind, rng.describe(), rng.at_most and f"at most {rng.at_most}")))
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default  # type: ignore[misc]
        if dataclasses.is_dataclass(default):
            rows.extend(describe(type(default), f"{prefix}{f.name}."))
        else:
            rows.append((f"{prefix}{f.name}", kind, docs.get(f.name, "")))
    return rows
