"""Planner configuration (section `plan`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PlanConfig:
    cluster: str = ""
    """Cluster description YAML (GPU types, counts, prices, links)."""
    budget_per_hour: float = 0.0
    """Price budget in dollars per hour (0: unlimited)."""
