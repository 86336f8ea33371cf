"""Component registries: one per kind of pluggable part, built-ins and user parts resolved one way.

    REWARDS = Registry("reward function", "agent.reward_fn")
    @REWARDS.register("f1")
    def f1(x): ...
    REWARDS.resolve("f1")                  # the registered object
    REWARDS.resolve("my_pkg.rewards:mine")  # imported from the user's module (inside any Ray worker)

A registry may name the modules that register its built-ins (`builtins=`): they are imported on the
first lookup, so a light module can own the registry (config validation imports it) while the
built-ins, registered with the same decorator a user part uses, load only when needed.

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

    def __init__(self, kind: str, key: str, builtins: tuple[str, ...] = ()):
        self.kind = kind
        """What the components are, for messages (`reward function`)."""
        self.key = key
        """The config key that selects one (`agent.reward_fn`), for messages."""
        self.builtins = builtins
        """Modules that register the built-in components, imported on the first lookup."""
        self._items: dict[str, Any] = {}
        self._loaded = not builtins
        REGISTRIES[key] = self

    def _load_builtins(self) -> None:
        if self._loaded:
            return
        self._loaded = True  # set first: a built-in module's own lookups must not import it again
        try:
            for module in self.builtins:
                importlib.import_module(module)
        except BaseException:
            self._loaded = False
            raise

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
        self._load_builtins()
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        self._load_builtins()
        return name in self._items

    def check(self, spec: str, keywords: tuple[str, ...] = (), key: str = "") -> None:
        """Raise ComponentError unless `spec` is one of `keywords` (the field's own values, e.g. `auto`), a
        registered name or has import-path syntax (no import). `key`: the config key, when not `self.key`."""
        self._load_builtins()
        if spec not in keywords and spec not in self._items and not is_import_path(spec):
            raise ComponentError(self._unknown(spec, keywords, key))

    def resolve(self, spec: str) -> Any:
        """The component a spec names (importing user modules as needed)."""
        self._load_builtins()
        if spec in self._items:
            return self._items[spec]
        if not is_import_path(spec):
            raise ComponentError(self._unknown(spec))
        return import_object(spec, self.kind, self.key)

    def _unknown(self, spec: str, keywords: tuple[str, ...] = (), key: str = "") -> str:
        valid = ", ".join([*(k or "''" for k in keywords), *self._items]) or "(none)"
        return (f"{key or self.key}: unknown {self.kind} '{spec}'. Valid: {valid}, "
                f"or an import path package.module:attribute")


def _describe(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"


REGISTRIES: dict[str, Registry] = {}
"""Every registry by the config key it serves (filled as the packages that own them are imported)."""
