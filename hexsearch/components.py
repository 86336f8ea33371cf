"""Config fields that name a pluggable part, and the registry (core/registry.py) each one asks.

    check_components(cfg)          # ComponentError naming the key and the valid names, at config load
    component_names("eval.suite")  # ['xbench', 'browsecomp', 'gaia', ...]: what `hexsearch config` lists

The names live only in the registries: a field here says which registry validates it and which
keywords of its own it accepts besides (e.g. `eval.judge: auto`). A list field checks each item.
Import paths `package.module:attribute` pass on syntax; they are imported later, where they run.
"""

from __future__ import annotations

import importlib
from typing import Any

from eval.config import JUDGE_KEYWORDS, PRIMARY_KEYWORDS

COMPONENT_FIELDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "agent.reward_fn": ("agent.rewards:REWARDS", ()),
    "agent.context_policy": ("agent.context:POLICIES", ()),
    "train.workflow": ("agent.workflow:WORKFLOWS", ()),
    "train.eval_suite": ("eval.suites:SUITES", ("",)),
    "eval.suite": ("eval.suites:SUITES", ()),
    "eval.scorers": ("eval.scorers:SCORERS", ()),
    "eval.judge": ("eval.judges:JUDGE_PROMPTS", JUDGE_KEYWORDS),
    "eval.primary": ("eval.scorers:SCORERS", PRIMARY_KEYWORDS),
    "datagen.actions": ("datagen.actions:ACTIONS", ()),
    "tools.builtin": ("tools.builtin:BUILTIN_TOOLS", ()),
    "engine.backend": ("serving.backends:ENGINE_BACKENDS", ()),
    "agent.judge.backend": ("serving.backends:ENGINE_BACKENDS", ("openai",)),
    "datagen.generator.backend": ("serving.backends:ENGINE_BACKENDS", ("openai",)),
    "datagen.solver.backend": ("serving.backends:ENGINE_BACKENDS", ("openai",)),
    "datagen.judge.backend": ("serving.backends:ENGINE_BACKENDS", ("openai",)),
}
"""Dotted config key -> (`module:attribute` of its Registry, the field's own keywords)."""


def registry_of(key: str) -> Any:
    """The Registry that validates config key `key` (imports its module)."""
    module, attr = COMPONENT_FIELDS[key][0].split(":")
    return getattr(importlib.import_module(module), attr)


def component_names(key: str) -> list[str]:
    """The keywords and registered names config key `key` accepts (besides import paths)."""
    keywords = [k for k in COMPONENT_FIELDS[key][1] if k]
    return [*keywords, *registry_of(key).names()]


def check_components(cfg: Any) -> None:
    """Every field of COMPONENT_FIELDS names a keyword, a registered part or an import path; ComponentError
    (a ValueError naming the key and the valid names) otherwise."""
    for key, (_, keywords) in COMPONENT_FIELDS.items():
        value = cfg
        for part in key.split("."):
            value = getattr(value, part)
        registry = registry_of(key)
        for spec in value if isinstance(value, (list, tuple)) else [value]:
            registry.check(spec, keywords, key=key)
