"""Group-relative advantages and dynamic filtering.

For the rewards r_1..r_G of one group (one question, G sampled trajectories):

    grpo    A_i = (r_i - mean(r)) / (std(r) + eps)            std: population std of the group
    rloo    A_i = r_i - mean_{j != i} r_j = G / (G - 1) * (r_i - mean(r))
    drgrpo  A_i = r_i - mean(r)                               (Dr. GRPO: no std division)

Every policy token of trajectory i gets A_i (outcome reward, gamma = lambda = 1). A group whose
rewards are all equal carries no signal under any estimator (every A_i = 0): dynamic filtering
drops it rather than spending compute on a zero gradient.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import get_args

from trainer.config import Advantage

ESTIMATORS: tuple[str, ...] = get_args(Advantage)


def group_advantages(rewards: Sequence[float], estimator: str = "grpo", eps: float = 1e-4) -> list[float]:
    """Advantages of one group's trajectories (see module docstring)."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator '{estimator}'; valid: {', '.join(ESTIMATORS)}")
    g = len(rewards)
    if g == 0:
        return []
    mean = sum(rewards) / g
    centred = [r - mean for r in rewards]
    if estimator == "drgrpo":
        return centred
    if estimator == "rloo":
        return [c * g / (g - 1) if g > 1 else 0.0 for c in centred]
    std = math.sqrt(sum(c * c for c in centred) / g)
    return [c / (std + eps) for c in centred]


def has_signal(rewards: Sequence[float], tol: float = 1e-6) -> bool:
    """False when all rewards of a group are equal (zero variance: no learning signal)."""
    return len(rewards) > 1 and (max(rewards) - min(rewards)) > tol
