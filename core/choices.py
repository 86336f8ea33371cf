"""Fixed-choice config fields: `typing.Literal` annotations, checked on dataclass instances (leaf module).

    Prefill = Literal["none", "tags", "answer", "think"]     # in a config module, named once
    check_choices(cfg, "agent")   # ValueError: agent.prefill: invalid value 'tag'; valid: none, tags, answer, think

OmegaConf validates Literal fields when a config is loaded (hexsearch.config); a dataclass built in
Python code (tests, benchmarks, library use) bypasses it, so a component that takes a config checks
it with `check_choices`. Code that dispatches on such a value derives its cases from the same alias
with `typing.get_args` instead of repeating the values.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any, Literal


def literal_values(tp: Any) -> tuple[Any, ...] | None:
    """The allowed values of a `Literal[...]` annotation (nested Literals flattened); None for any other type."""
    if typing.get_origin(tp) is not Literal:
        return None
    values: list[Any] = []
    for arg in typing.get_args(tp):
        nested = literal_values(arg)
        values.extend(nested if nested is not None else (arg,))
    return tuple(values)


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """Field name -> resolved annotation of a dataclass (string annotations resolved)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints.get(f.name, f.type) for f in dataclasses.fields(cls)}


def item_literal_values(tp: Any) -> tuple[Any, ...] | None:
    """The allowed values of each item of a `list[Literal[...]]` (or tuple) annotation; None otherwise."""
    if typing.get_origin(tp) not in (list, tuple):
        return None
    args = [a for a in typing.get_args(tp) if a is not Ellipsis]
    return literal_values(args[0]) if len(args) == 1 else None


def literal_fields(cls: type) -> dict[str, tuple[Any, ...]]:
    """Field name -> allowed values, for the Literal fields of a dataclass (not recursive)."""
    out: dict[str, tuple[Any, ...]] = {}
    for name, tp in field_types(cls).items():
        values = literal_values(tp)
        if values is not None:
            out[name] = values
    return out


def literal_item_fields(cls: type) -> dict[str, tuple[Any, ...]]:
    """Field name -> allowed values of each item, for the `list[Literal[...]]` fields of a dataclass."""
    out: dict[str, tuple[Any, ...]] = {}
    for name, tp in field_types(cls).items():
        values = item_literal_values(tp)
        if values is not None:
            out[name] = values
    return out


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def check_choices(obj: Any, prefix: str = "") -> None:
    """Raise ValueError naming the dotted key and the valid values for the first Literal field of `obj`
    (a dataclass instance, walked recursively through nested dataclasses and lists/dicts of them) whose
    value, or for a `list[Literal[...]]` field one of whose items, is not one of its choices."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return
    allowed, item_allowed = literal_fields(type(obj)), literal_item_fields(type(obj))
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), _join(prefix, f.name)
        if f.name in allowed:
            _check_value(value, key, allowed[f.name])
        elif f.name in item_allowed and isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                _check_value(item, f"{key}[{i}]", item_allowed[f.name])
        else:
            _check_nested(value, key)


def _check_value(value: Any, key: str, valid: tuple[Any, ...]) -> None:
    if value not in valid:
        raise ValueError(f"{key}: invalid value {value!r}; valid: {', '.join(map(str, valid))}")


def _check_nested(value: Any, key: str) -> None:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        check_choices(value, key)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_nested(item, f"{key}[{i}]")
    elif isinstance(value, dict):
        for k, item in value.items():
            _check_nested(item, _join(key, str(k)))
