"""From accepted groups to training samples (advantages, dynamic filtering) and rollout metrics.

Every segment of a trajectory becomes one `Sample` carrying the trajectory's group-relative
advantage (all segments share the reward). Zero-variance groups are left out under the `drop` and
`reject` filters (the latter never lets them this far); under `none` they stay, with advantage 0.
Under `loss_agg: seq-mean-token-mean` each sample's tokens weigh 1 / (the policy tokens of its whole
trajectory), so every episode weighs the same in the loss (trainer/loss.py).
"""

from __future__ import annotations

from typing import Any, get_args

from trainer.advantages import group_advantages
from trainer.buffer import Group
from trainer.config import LossAgg
from trainer.packing import Sample


def accuracy(traj: Any) -> float:
    """Exact match of the predicted answer against any gold answer (0 when the agent never answered)."""
    from agent.rewards import exact_match

    if not traj.prediction:
        return 0.0
    return max((exact_match(traj.prediction, g) for g in traj.gold), default=0.0)


def build_samples(groups: list[Group], estimator: str, filter_groups: str,
                  loss_agg: str = "token-mean") -> tuple[list[Sample], int]:
    """(samples, kept groups)."""
    if loss_agg not in get_args(LossAgg):
        raise ValueError(f"unknown loss_agg {loss_agg!r}: {' or '.join(get_args(LossAgg))}")
    samples: list[Sample] = []
    kept = 0
    for g in groups:
        if filter_groups != "none" and not g.has_signal:
            continue
        kept += 1
        for traj, adv in zip(g.trajectories, group_advantages(g.rewards, estimator), strict=True):
            segments = [Sample(seg.token_ids, seg.loss_mask, seg.logprobs, seg.versions, float(adv),
                               meta={"group": g.key}) for seg in traj.segments if seg.num_generated]
            episode_tokens = sum(s.num_loss_tokens for s in segments)
            if loss_agg == "seq-mean-token-mean" and episode_tokens:
                for s in segments:
                    s.loss_weight = 1.0 / episode_tokens
            samples += segments
    return samples, kept


def rollout_metrics(groups: list[Group], version: int) -> tuple[dict[str, float], list[float]]:
    """Per-step agent/rollout figures of the consumed groups, and the staleness of each trajectory."""
    trajs = [t for g in groups for t in g.trajectories]
    n = max(len(trajs), 1)
    staleness = [float(version - t.min_version) for t in trajs if t.min_version >= 0]
    return {
        "train/reward": sum(t.reward for t in trajs) / n,
        "train/accuracy": sum(accuracy(t) for t in trajs) / n,
        "agent/turns": sum(t.num_turns for t in trajs) / n,
        "agent/tool_calls": sum(len(t.tool_calls) for t in trajs) / n,
        "agent/format_errors": sum(t.format_errors for t in trajs) / n,
        "agent/answered": sum(t.prediction is not None for t in trajs) / n,
        "agent/gen_tokens": sum(t.num_generated for t in trajs) / n,
        "tools/errors": float(sum(1 for t in trajs for c in t.tool_calls if c.error)),
        "tools/latency_s": (sum(c.latency_s for t in trajs for c in t.tool_calls)
                            / max(1, sum(len(t.tool_calls) for t in trajs))),
        **bucket_metrics(trajs, "train/accuracy", "agent/tool_calls"),
    }, staleness


def eval_figures(trajs: list[Any]) -> dict[str, float]:
    """The dev evaluation's figures of a list of scored trajectories (training's and SFT's alike)."""
    n = max(len(trajs), 1)
    return {"eval/reward": sum(t.reward for t in trajs) / n, "eval/accuracy": sum(accuracy(t) for t in trajs) / n,
            "eval/answered": sum(t.prediction is not None for t in trajs) / n,
            "eval/tool_calls": sum(len(t.tool_calls) for t in trajs) / n, "eval/questions": float(len(trajs)),
            **bucket_metrics(trajs, "eval/accuracy", "eval/tool_calls")}


def bucket_metrics(trajs: list[Any], accuracy_key: str, tool_calls_key: str) -> dict[str, float]:
    """`<accuracy_key>/<bucket>` and `<tool_calls_key>/<bucket>` (mean tool calls per episode) for each
    difficulty bucket among `trajs` (`hops2`, `n8`, ...: agent.qa.question_bucket, carried in
    `meta["bucket"]`); ASearcher's figure of tool calls and accuracy over steps, per difficulty."""
    by: dict[str, list[Any]] = {}
    for t in trajs:
        if t.meta.get("bucket"):
            by.setdefault(t.meta["bucket"], []).append(t)
    out: dict[str, float] = {}
    for b, ts in sorted(by.items()):
        out[f"{accuracy_key}/{b}"] = sum(accuracy(t) for t in ts) / len(ts)
        out[f"{tool_calls_key}/{b}"] = sum(len(t.tool_calls) for t in ts) / len(ts)
    return out
