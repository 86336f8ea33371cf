"""Metrics: one JSONL line per step, TensorBoard, optional W&B, and the reward-curve PNG.

Names are stable (dashboards and tests read them):

    train/reward train/accuracy train/loss train/clip_frac train/behav_weight_{mean,max,min,masked_frac}
    train/approx_kl train/entropy train/grad_norm train/lr train/tokens_per_s train/kept_groups
    rollout/staleness (histogram; JSONL keeps rollout/staleness_{mean,max} and the counts)
    rollout/gen_tokens_per_s rollout/queue_depth rollout/running rollout/accepted rollout/rejected
    rollout/refused_stale agent/turns agent/tool_calls agent/format_errors agent/answered tools/errors
    eval/reward eval/accuracy time/step_s time/train_s time/sync_s time/wait_s
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any


class MetricsLogger:
    """Writes each `log(step, metrics)` to metrics.jsonl, TensorBoard and W&B."""

    def __init__(self, path: str | Path, tb_dir: str | Path | None = None, wandb_project: str | None = None,
                 run_name: str = "", config: dict | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tb = self._wandb = None
        if tb_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(tb_dir))
        if wandb_project:
            try:
                import wandb
            except ImportError:
                wandb = None
            if wandb is not None:
                self._wandb = wandb.init(project=wandb_project, name=run_name or None, config=config or {})

    def log(self, step: int, metrics: dict[str, Any], histograms: dict[str, list[float]] | None = None) -> None:
        row = {"step": step, "time": time.time(), **{k: _plain(v) for k, v in metrics.items()}}
        for name, values in (histograms or {}).items():
            if values:
                row[f"{name}_mean"] = sum(values) / len(values)
                row[f"{name}_max"] = max(values)
                counts: dict[str, int] = {}
                for v in values:
                    counts[str(int(v))] = counts.get(str(int(v)), 0) + 1
                row[f"{name}_hist"] = counts
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and math.isfinite(float(v)):
                    self._tb.add_scalar(k, float(v), step)
            for name, values in (histograms or {}).items():
                if values:
                    import numpy as np

                    self._tb.add_histogram(name, np.asarray(values, dtype=float), step)
            self._tb.flush()
        if self._wandb is not None:
            import wandb

            extra = {k: wandb.Histogram(v) for k, v in (histograms or {}).items() if v}
            self._wandb.log({**{k: v for k, v in metrics.items() if isinstance(v, (int, float))}, **extra}, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _plain(v: Any) -> Any:
    return float(v) if hasattr(v, "item") else v


def truncate_after(path: str | Path, step: int, step_of=lambda row: row.get("step", 0)) -> None:
    """Drop JSONL lines whose step is after `step` (a resumed run re-does those steps)."""
    p = Path(path)
    if not p.exists():
        return
    keep = [line for line in p.read_text().splitlines() if line.strip() and step_of(json.loads(line)) <= step]
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text("".join(line + "\n" for line in keep))
    tmp.replace(p)


def read_metrics(path: str | Path) -> list[dict]:
    p = Path(path)
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.exists() else []


def eval_row_at(rows: list[dict], step: int) -> dict | None:
    """The (last) metrics row of `step` holding a dev evaluation, or None: the figures of a checkpoint's
    weights that `sft --resume` and RL's `train.reuse_init_eval` take instead of evaluating again."""
    at = [r for r in rows if r.get("step") == step and "eval/reward" in r]
    return at[-1] if at else None


def plot_reward_curve(metrics_path: str | Path, out_png: str | Path) -> Path | None:
    """train/reward per step (and eval/reward where evaluated) as a PNG; None without data."""
    rows = read_metrics(metrics_path)
    train = [(r["step"], r["train/reward"]) for r in rows if "train/reward" in r]
    dev = [(r["step"], r["eval/reward"]) for r in rows if "eval/reward" in r]
    if not train and not dev:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train, strict=True), label="train reward (sampled)", alpha=0.7)
    if dev:
        ax.plot(*zip(*dev, strict=True), "o-", label="dev reward (eval)")
    ax.set_xlabel("step (weight version)")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return Path(out_png)


def plot_search_curve(metrics_path: str | Path, out_png: str | Path) -> Path | None:
    """ASearcher's figure: tool calls per episode (left) and accuracy (right) over training steps, one
    line per difficulty bucket (`agent/tool_calls/<bucket>`, `train/accuracy/<bucket>`, sampled
    episodes); None when the run logged no buckets."""
    from agent.qa import bucket_order

    rows = read_metrics(metrics_path)
    buckets = sorted({k.rsplit("/", 1)[1] for r in rows for k in r if k.startswith("agent/tool_calls/")},
                     key=bucket_order)
    if not buckets:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (calls, acc) = plt.subplots(1, 2, figsize=(11, 4))
    for b in buckets:
        for ax, key in ((calls, f"agent/tool_calls/{b}"), (acc, f"train/accuracy/{b}")):
            points = [(r["step"], r[key]) for r in rows if key in r]
            if points:
                ax.plot(*zip(*points, strict=True), label=b, alpha=0.8)
    for ax, label in ((calls, "tool calls per episode"), (acc, "accuracy (sampled)")):
        ax.set_xlabel("step (weight version)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    calls.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return Path(out_png)
