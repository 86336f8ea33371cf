"""Component registries: one per kind of pluggable part, built-ins and user parts resolved one way.

    REWARDS = Registry("reward function", "agent.reward_fn")
    @REWARDS.register("f1")
    def f1(x): ...
    REWARDS.resolve("f1")                  # the registered object
    REWARDS.resolve("my_pkg.rewards:mine")  # imported from the user's module (inside any Ray worker)

A *spec* is either a registered name or an import path `package.module:attribute` (dots allowed
in the attribute: `pkg.mod:Class.factory`). Specs are plain strings in the config, so a config
crosses Ray and reaches remote nodes unchanged and every worker resolves it where it runs.
Registering the same name twice with a different object is an error (two plug-ins would silently
shadow each other otherwise).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class ComponentError(ValueError):
    """A spec that names no registered component and no importable object; one line, with the valid names."""


def is_import_path(spec: str) -> bool:
    """True for `package.module:attribute` specs."""
    return bool(_IMPORT_PATH.match(spec or ""))


def import_object(spec: str, what: str = "component", key: str = "") -> Any:
    """The object an import path `pkg.mod:attr` names; ComponentError naming the config key otherwise."""
    where = f"{key}: " if key else ""
    if not is_import_path(spec):
        raise ComponentError(f"{where}'{spec}' is not an import path of the form package.module:attribute")
    module_name, attr = spec.split(":", 1)
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ComponentError(f"{where}cannot import module '{module_name}' for {what} '{spec}': {e}") from e
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise ComponentError(f"{where}module '{module_name}' has no attribute '{attr}' ({what} '{spec}')") from e
    return obj


class Registry:
    """Named components of one kind (see the module docstring)."""

    def __init__(self, kind: str, key: str):
        self.kind = kind
        """What the components are, for messages (`reward function`)."""
        self.key = key
        """The config key that selects one (`agent.reward_fn`), for messages."""
        self._items: dict[str, Any] = {}
        REGISTRIES[key] = self

    def register(self, name: str | None = None) -> Callable[[Any], Any]:
        """Decorator: register an object under `name` (default: its `name` attribute, else `__name__`)."""

        def deco(obj: Any) -> Any:
            self.add(name or getattr(obj, "name", None) or obj.__name__, obj)
            return obj

        return deco

    def add(self, name: str, obj: Any) -> None:
        old = self._items.get(name)
        if old is not None and old is not obj:
            raise ComponentError(f"{self.kind} '{name}' is already registered ({_describe(old)})")
        self._items[name] = obj

    def names(self) -> list[str]:
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def check(self, spec: str) -> None:
        """Raise ComponentError unless `spec` is a registered name or has import-path syntax (no import)."""
        if spec not in self._items and not is_import_path(spec):
            raise ComponentError(self._unknown(spec))

    def resolve(self, spec: str) -> Any:
        """The component a spec names (importing user modules as needed)."""
        if spec in self._items:
            return self._items[spec]
        if not is_import_path(spec):
            raise ComponentError(self._unknown(spec))
        return import_object(spec, self.kind, self.key)

    def _unknown(self, spec: str) -> str:
        return (f"{self.key}: unknown {self.kind} '{spec}'. Valid: {', '.join(self._items) or '(none)'}, "
                f"or an import path package.module:attribute")


def _describe(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"


REGISTRIES: dict[str, Registry] = {}
"""Every registry by the config key it serves (filled as the packages that own them are imported)."""
