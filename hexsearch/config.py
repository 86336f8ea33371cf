"""Config loading: dataclasses are the single source of truth, YAML and `key=value` map onto them.

    cfg = load_config("configs/quickstart.yaml", ["train.lr=1e-5", "agent.max_turns=8"])

Every section is a dataclass owned by its package (`serving.config.EngineConfig`, ...), with a
docstring under each field. OmegaConf structured configs do the merging and type checking; this
module only turns their errors into messages that name the key and list the valid ones.
A YAML file may start with `extends: other.yaml` (path relative to the file) to inherit a recipe.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from agent.config import AgentConfig
from datagen.config import DatagenConfig, WorldConfig
from eval.config import EvalConfig
from serving.config import EngineConfig
from tools.config import ToolsConfig
from trainer.config import TrainConfig
from trainer.planner.config import PlanConfig


class ConfigError(ValueError):
    """A config problem explained in one line (unknown key, wrong type, missing file)."""


@dataclass
class RunConfig:
    name: str = ""
    """Run name; the run folder is `<root>/<name>`. Empty: `<command>-<timestamp>`."""
    root: str = "runs"
    """Folder that holds all runs."""
    seed: int = 0
    """Global random seed (python, numpy, torch, data order)."""
    log_level: str = "WARNING"
    """Python logging level for the console and `log.txt`."""


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


def _explain(err: OmegaConfBaseException, schema: DictConfig, source: str) -> ConfigError:
    key = getattr(err, "full_key", None) or ""
    if isinstance(err, (ConfigKeyError, ConfigAttributeError)):
        where = _section(schema, key) if key else schema
        valid = ", ".join(sorted(_valid_keys(where)))
        return ConfigError(f"{source}: unknown config key '{key}'. Valid keys here: {valid}")
    if isinstance(err, ValidationError):
        msg = str(err).splitlines()[0]
        return ConfigError(f"{source}: bad value for '{key}': {msg}")
    return ConfigError(f"{source}: {str(err).splitlines()[0]}")


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


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> HexConfig:
    """Resolve defaults < YAML (with its `extends` chain) < `key=value` overrides into a HexConfig."""
    schema = OmegaConf.structured(HexConfig)
    merged = schema
    layers = _load_yaml(Path(path)) if path else []
    for bad in (o for o in overrides or [] if "=" not in o):
        raise ConfigError(f"override '{bad}' is not of the form key=value (e.g. train.lr=1e-5)")
    if overrides:
        layers.append(("command line", OmegaConf.from_dotlist(list(overrides))))
    for source, layer in layers:
        try:
            merged = OmegaConf.merge(merged, layer)
        except OmegaConfBaseException as e:
            raise _explain(e, schema, source) from e
    try:
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as e:
        raise _explain(e, schema, "config") from e


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
    """(dotted key, type, docstring) for every leaf field, recursing into nested dataclasses."""
    rows: list[tuple[str, str, str]] = []
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        ftype = f.type if isinstance(f.type, type) else None
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default  # type: ignore[misc]
        if dataclasses.is_dataclass(default):
            rows.extend(describe(type(default), f"{prefix}{f.name}."))
        else:
            rows.append((f"{prefix}{f.name}", str(ftype.__name__ if ftype else f.type), docs.get(f.name, "")))
    return rows
