"""Evaluation suites: one record per suite (its loader, default scorers, judge prompt, encrypted flag),
in the SUITES registry, so `eval.suite` (and `train.eval_suite`) take a built-in name or `pkg.mod:name`.

    data = load_suite("gaia", "metadata.jsonl", limit=50)    # SuiteData(items, skipped, source, encrypted)
    get_suite("my_pkg.suites:hle").scorers                    # a user suite: a `Suite` object in a module

Built-in suites are registered in eval/loaders.py with the `suite` decorator; a user registers one the
same way (importing this module), or writes `Suite(...)` as a module attribute and names it by import
path. A loader is `load(path, *, limit)` returning eval.rows.SuiteData; a suite with `world=True` reads
the offline world, may be given no path and gets `world_config` too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.registry import ComponentError, Registry
from eval.rows import PathLike, SuiteData

if TYPE_CHECKING:
    from world.config import WorldConfig

Loader = Callable[..., SuiteData]

SUITES = Registry("eval suite", "eval.suite", builtins=("eval.loaders",))
"""Eval suites by name (`Suite` records)."""


@dataclass(frozen=True)
class Suite:
    """Everything that makes a suite: how to read its file and how to score it."""

    name: str
    load: Loader
    """`load(path, *, limit)` -> SuiteData (with `world_config=` too when `world`)."""
    scorers: tuple[str, ...] = ("em", "f1")
    """The rule-based scorers it reports, its official one first (names or specs of eval.scorers.SCORERS)."""
    judge: str | None = None
    """Its published LLM-judge prompt (eval.judges.JUDGE_PROMPTS; what `eval.judge=auto` uses), None: no judge."""
    encrypted: bool = False
    """Its files are encrypted: questions and answers are never written in clear (unless `eval.write_plaintext`)."""
    world: bool = False
    """It reads the offline world: the data path may be empty (the configured world), `world_config` is passed."""


def suite(name: str, *, scorers: tuple[str, ...] = ("em", "f1"), judge: str | None = None, encrypted: bool = False,
          world: bool = False) -> Callable[[Loader], Loader]:
    """Decorator: register the loader it wraps as suite `name` (the loader itself is returned unchanged)."""

    def deco(load: Loader) -> Loader:
        SUITES.add(name, Suite(name, load, tuple(scorers), judge, encrypted, world))
        return load

    return deco


def get_suite(spec: str) -> Suite:
    """The Suite a name (case-insensitive) or `pkg.mod:attr` names; ComponentError listing the valid names."""
    name = spec.strip()
    found = SUITES.resolve(name.lower() if name.lower() in SUITES else name)
    if not isinstance(found, Suite):
        raise ComponentError(f"eval.suite: '{spec}' is a {type(found).__name__}, not an eval.suites.Suite")
    return found


def load_suite(suite: str, path: PathLike | None, *, limit: int | None = None,
               world_config: WorldConfig | None = None) -> SuiteData:
    """Read the file of `suite` (see get_suite); at most `limit` items.

    `world_config` (a `world.config.WorldConfig`, e.g. `cfg.world`) picks the world the world suites read
    when `path` is None; the default is `WorldConfig()`. Other suites ignore it. Raises ValueError
    (ComponentError) for an unknown suite or a negative limit, DataError for a missing path or file and for
    any malformed row (naming the file and line).
    """
    from agent.qa import DataError

    found = get_suite(suite)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative integer or None, got {limit!r}")
    if found.world:
        data = found.load(path, limit=limit, world_config=world_config)
    elif path is None:
        raise DataError(f"suite {found.name!r} needs a data file")
    else:
        data = found.load(path, limit=limit)
    data.encrypted = data.encrypted or found.encrypted
    return data

