"""Evaluation configuration (section `eval`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EvalConfig:
    suites: list[str] = field(default_factory=lambda: ["world-dev"])
    """Evaluation suites to run."""
    k: int = 1
    """Samples per question (Avg@k / Pass@k)."""
