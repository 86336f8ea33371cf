"""Numeric ranges of config fields, declared on the field they bound (leaf module).

    max_turns: int = ranged(32, ge=1, le=1000)
    '''Most LLM calls per episode.'''

    check_ranges(cfg, "agent")  # ValueError: agent.max_turns: -5 is out of range: it must be at least 1 and at most 1000

The rule: every int and float field of a config dataclass is a finite number, at least 0, unless its
declaration says otherwise with `ranged`: a tighter lower bound (`ge=1`, or `gt=0` for strictly above),
an upper bound (`le`), no lower bound (`ge=None`: a penalty, a -1 sentinel), or `at_most="other"`, a
sibling field this one may not exceed (min_hops <= max_hops). A field added without `ranged` is covered
by the rule; use `ranged` only when 0 is wrong for it or it has an upper bound.

The config loader (hexsearch.config) runs `check_ranges` on the whole config; a component given a
dataclass built in code (tests, library use) checks its section the same way, as with `check_choices`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from core.choices import field_types

T = TypeVar("T")


@dataclass(frozen=True)
class Range:
    """Where a numeric field's values may lie; `low` None is unbounded below, `high` None above."""

    low: float | None = 0
    high: float | None = None
    low_inclusive: bool = True
    at_most: str | None = None
    """A sibling field (same dataclass) this one may not exceed."""

    def allows(self, value: float) -> bool:
        if self.low is not None and (value < self.low or (value == self.low and not self.low_inclusive)):
            return False
        return self.high is None or value <= self.high

    def describe(self) -> str:
        parts = []
        if self.low is not None:
            parts.append(f"at least {self.low:g}" if self.low_inclusive else f"above {self.low:g}")
        if self.high is not None:
            parts.append(f"at most {self.high:g}")
        return " and ".join(parts)


DEFAULT_RANGE = Range()
"""The range of an int or float field declared without `ranged`."""


def ranged(default: T, *, ge: float | None = 0, gt: float | None = None, le: float | None = None,
           at_most: str | None = None) -> T:
    """A dataclass field with `default` whose value must be `>= ge` (or `> gt`) and `<= le`, and not above
    the sibling field `at_most`; `ge=None` (without `gt`) removes the lower bound."""
    rng = Range(gt, le, False, at_most) if gt is not None else Range(ge, le, True, at_most)
    return field(default=default, metadata={"range": rng})


def field_range(f: dataclasses.Field) -> Range:
    """The declared range of a numeric field (DEFAULT_RANGE when it has none)."""
    return f.metadata.get("range", DEFAULT_RANGE)


def numeric_fields(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any, Any, Range]]:
    """(dotted key, the dataclass instance holding it, value, range) of every int and float field of `obj`,
    nested dataclasses and lists/dicts of them included."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return
    types = field_types(type(obj))
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), f"{prefix}.{f.name}" if prefix else f.name
        if types[f.name] in (int, float):
            yield key, obj, value, field_range(f)
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                yield from numeric_fields(item, f"{key}[{i}]")
        elif isinstance(value, dict):
            for k, item in value.items():
                yield from numeric_fields(item, f"{key}.{k}")
        else:
            yield from numeric_fields(value, key)


def range_problem(obj: Any, prefix: str = "") -> str | None:
    """The first out-of-range value of `obj` as one line, or None: single values first, then relations."""
    fields = list(numeric_fields(obj, prefix))
    for key, _, value, rng in fields:
        if isinstance(value, float) and not math.isfinite(value):
            return f"{key}: {value} is not a finite number"
        if not rng.allows(value):
            return f"{key}: {value:g} is out of range: it must be {rng.describe()}"
    for key, owner, value, rng in fields:
        if rng.at_most is not None and value > (bound := getattr(owner, rng.at_most)):
            other = key.rsplit(".", 1)[0] + "." + rng.at_most if "." in key else rng.at_most
            return f"{key}={value:g} is larger than {other}={bound:g}"
    return None


def check_ranges(obj: Any, prefix: str = "") -> None:
    """Raise ValueError naming the dotted key and its range for the first out-of-range value of `obj`."""
    problem = range_problem(obj, prefix)
    if problem is not None:
        raise ValueError(problem)
