"""The numeric range of every config field, checked when the config loads (not inside a Ray worker).

The rule: every int and float field is at least 0, except the few in `MAY_BE_NEGATIVE`. Fields in
`RANGES` are held to a tighter range `(low, high, low_inclusive)`: `high` None means unbounded;
`low_inclusive=False` means strictly above `low` (a learning rate of 0 trains nothing). A field
added to a config dataclass is covered by the rule without being listed; list it here only when
0 is wrong for it or it has an upper bound. Relations between fields (min <= max) are in `RELATIONS`.

`check_limits(cfg)` returns the first violation as one line naming the field, or None.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

MAY_BE_NEGATIVE = {"agent.invalid_penalty", "eval.temperature"}
"""Fields whose negative values mean something (a penalty; -1 = 'the default temperature')."""

_POSITIVE_INTS = """
engine.max_batch_size engine.max_model_len engine.prefill_chunk_tokens engine.tensor_parallel_size
tools.topk tools.max_concurrency tools.max_page_bytes tools.page_chunk_chars tools.max_page_chunks
tools.retrieval_max_batch tools.snippet_chars
agent.max_turns agent.max_new_tokens agent.max_context_tokens agent.max_calls_per_turn agent.page_chunk_chars
agent.max_page_chunks agent.max_obs_chars agent.judge.max_new_tokens
world.min_hops
train.batch_size train.group_size train.max_inflight_trajectories train.rollout_workers train.worker_concurrency
train.engine_replicas train.learner_workers train.minibatches train.micro_batch_tokens train.keep_checkpoints
train.max_question_attempts train.max_consecutive_failures
sft.batch_size sft.rft_samples sft.concurrency
eval.n eval.concurrency
datagen.num_questions datagen.concurrency datagen.max_page_chars datagen.max_info_points datagen.min_hops
datagen.target_hops datagen.max_hops datagen.solver_attempts datagen.search_attempts
datagen.generator.max_new_tokens datagen.solver.max_new_tokens datagen.judge.max_new_tokens
""".split()

_POSITIVE_FLOATS = """
engine.request_timeout_s tools.timeout_s agent.wall_clock_s agent.judge.timeout_s train.lr train.weight_sync_timeout_s
train.engine_health_timeout_s train.learner_step_timeout_s sft.lr sft.epochs
datagen.generator.timeout_s datagen.solver.timeout_s datagen.judge.timeout_s
""".split()

RANGES: dict[str, tuple[float, float | None, bool]] = {
    **{k: (1, None, True) for k in _POSITIVE_INTS},
    **{k: (0, None, False) for k in _POSITIVE_FLOATS},
    "agent.max_turns": (1, 1000, True),
    "agent.max_repeated_calls": (0, 1000, True),
    "agent.top_p": (0, 1, False),
    "agent.compact_to": (0, 0.95, True),
    "agent.valid_inst_ratio": (0, 1, True),
    "agent.aug_answer_weight": (0, 1, True),
    "world.entities": (20, None, True),
    "world.max_hops": (1, 4, True),
    "world.lineage_length": (2, 64, True),
    "train.eps_clip": (0, 1, False),
    "datagen.max_solver_accuracy": (0, 1, True),
    "datagen.dedup_threshold": (0, 1, False),
}

RELATIONS: list[tuple[str, str]] = [
    ("world.min_hops", "world.max_hops"), ("datagen.min_hops", "datagen.max_hops"),
    ("datagen.target_hops", "datagen.max_hops"), ("train.eps_clip", "train.eps_clip_high"),
]
"""(a, b): a <= b."""


def numeric_fields(cls: type, prefix: str = "") -> list[str]:
    """Dotted names of every int and float field of a config dataclass, nested sections included."""
    hints = typing.get_type_hints(cls)
    out: list[str] = []
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        if dataclasses.is_dataclass(t):
            out += numeric_fields(t, f"{prefix}{f.name}.")
        elif t in (int, float):
            out.append(prefix + f.name)
    return out


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _describe(low: float, high: float | None, inclusive: bool) -> str:
    lower = f"at least {low:g}" if inclusive else f"above {low:g}"
    return lower if high is None else f"{lower} and at most {high:g}"


def check_limits(cfg: Any) -> str | None:
    """The first out-of-range value as one line (`agent.max_turns: -5 is out of range: it must be at least
    1`), or None when every value is in range."""
    for name in numeric_fields(type(cfg)):
        value = _get(cfg, name)
        if isinstance(value, float) and not math.isfinite(value):
            return f"{name}: {value} is not a finite number"
        low, high, inclusive = RANGES.get(name, (0, None, True))
        if name in MAY_BE_NEGATIVE and name not in RANGES:
            continue
        if value < low or (value == low and not inclusive) or (high is not None and value > high):
            return f"{name}: {value:g} is out of range: it must be {_describe(low, high, inclusive)}"
    for a, b in RELATIONS:
        if _get(cfg, a) > _get(cfg, b):
            return f"{a}={_get(cfg, a):g} is larger than {b}={_get(cfg, b):g}"
    return None
