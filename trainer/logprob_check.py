"""Token-exactness of a run's trajectories: re-score what the engine sampled with the weights that sampled it.

A trajectory stores, for every token the policy generated, the behaviour log-prob the engine recorded and the
weight version that produced it (agent/trajectory.py). The decoupled PPO loss trusts both. This check runs
one plain forward pass over each segment's `token_ids` with the weights of that version and compares:

    diff_t = | log softmax(f_v(x_<t))[x_t]  -  logprob_t |      for every policy token t generated at version v

Version 0 is the run's `engine.model` (for a run started with `train.init_from`, the exported cold start);
version v > 0 is the checkpoint saved at step v (`checkpoints/step-v`, whose `state.json` says version v), when
the run kept it. Tokens of versions whose weights are gone are counted, not checked. A run passes when the
mean difference is within the tolerance of the dtype (fp32: 1e-3; bf16/fp16: 5e-2, where an incremental
decode and a full forward round differently). Wrong weights, a shifted token or a mis-recorded log-prob give
differences of 0.1 and more.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.trajectory import Trajectory

TOLERANCE = {"float32": 1e-3, "bfloat16": 5e-2, "float16": 5e-2}


class CheckError(ValueError):
    """A run that cannot be checked (no trajectories, no weights for any version); one line."""


@dataclass
class EpisodeCheck:
    """The comparison for one trajectory."""

    question_id: str
    bucket: str
    turns: int
    tool_calls: int
    segments: int
    tokens: int
    checked: int = 0
    """Policy tokens re-scored."""
    unchecked: int = 0
    """Policy tokens of versions whose weights the run no longer has."""
    mean_diff: float = 0.0
    max_diff: float = 0.0


@dataclass
class RunCheck:
    """The comparison for the checked episodes of a run."""

    dtype: str
    tolerance: float
    versions: list[int] = field(default_factory=list)
    episodes: list[EpisodeCheck] = field(default_factory=list)

    @property
    def checked(self) -> int:
        return sum(e.checked for e in self.episodes)

    @property
    def mean_diff(self) -> float:
        return sum(e.mean_diff * e.checked for e in self.episodes) / max(1, self.checked)

    @property
    def max_diff(self) -> float:
        return max((e.max_diff for e in self.episodes), default=0.0)

    @property
    def ok(self) -> bool:
        return self.checked > 0 and self.mean_diff <= self.tolerance

    def as_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "tolerance": self.tolerance, "versions": self.versions, "checked": self.checked,
                "mean_diff": self.mean_diff, "max_diff": self.max_diff, "ok": self.ok,
                "episodes": [e.__dict__ for e in self.episodes]}


def read_trajectories(path: Path, min_turns: int) -> list[Trajectory]:
    """The trajectories of a JSONL file with policy tokens and at least `min_turns` turns, most turns first; a
    row that does not parse names its file and line."""
    found: list[Trajectory] = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                t = Trajectory.from_json(line)
            except (ValueError, TypeError) as e:
                raise CheckError(f"{path}:{n}: not a trajectory ({str(e)[:120]})") from None
            if t.num_turns >= min_turns and t.num_generated > 0:
                found.append(t)
    found.sort(key=lambda t: -t.num_turns)
    return found


def version_weights(run: Path) -> dict[int, Path | None]:
    """Weight version -> the checkpoint holding it (None: version 0, the run's engine.model)."""
    from trainer import checkpoint

    out: dict[int, Path | None] = {0: None}
    for folder in checkpoint.step_folders(run / "checkpoints"):
        if checkpoint.verify(folder):
            continue
        try:
            state = json.loads((folder / "state.json").read_text())
            out[int(state["loop"]["version"])] = folder
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def _model(cfg: dict, base: str, ckpt: Path | None, dtype: str):
    """An eval-mode model holding the weights of one version (`cfg`: the run's config.yaml)."""
    from serving.models import load_model, torch_dtype

    if ckpt is None:
        return load_model(base, dtype=dtype)
    from trainer.export import _merged_model, read_trained_weights, run_lora

    return _merged_model(base, read_trained_weights(ckpt), run_lora(cfg)).to(torch_dtype(dtype)).eval()


def check_run(run: Path, *, trajectories: Path | None = None, min_turns: int = 0, limit: int = 8,
              complete: bool = False, dtype: str | None = None, tolerance: float | None = None,
              threads: int = 0) -> RunCheck:
    """Re-score the policy tokens of the `limit` longest trajectories of a run (0: all; `complete`: only
    among those whose every version's weights the run still has). See the module docstring."""
    import torch

    from serving.models import torch_dtype
    from trainer.export import ExportError, run_config

    try:
        cfg = run_config(run)
    except ExportError as e:
        raise CheckError(str(e)) from None
    engine = cfg.get("engine") or {}
    base = engine.get("model")
    if not base:
        raise CheckError(f"{run}/config.yaml names no engine.model")
    path = trajectories or run / "trajectories" / "train.jsonl"
    if not path.exists():
        raise CheckError(f"{path} does not exist (was the run trained with train.save_trajectories=true?)")
    weights = version_weights(run)
    episodes = [t for t in read_trajectories(path, min_turns) if not complete or set(t.versions) <= set(weights)]
    if not episodes:
        raise CheckError(f"{path}: no trajectory with policy tokens and at least {min_turns} turns"
                         + (f" whose versions all have weights (there are {sorted(weights)})" if complete else ""))
    episodes = episodes[:limit] if limit > 0 else episodes
    resolved = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[
        torch_dtype(dtype or engine.get("dtype") or "auto")]
    report = RunCheck(resolved, TOLERANCE[resolved] if tolerance is None else tolerance)
    if threads > 0:
        torch.set_num_threads(threads)
    wanted = sorted({v for t in episodes for v in t.versions} & set(weights))
    report.versions = wanted
    diffs: list[list[float]] = [[] for _ in episodes]
    for version in wanted:  # one model in memory at a time
        model = _model(cfg, base, weights[version], resolved)
        for i, t in enumerate(episodes):
            diffs[i] += _diffs(model, t, version)
        del model
    for t, d in zip(episodes, diffs, strict=True):
        report.episodes.append(EpisodeCheck(
            t.question_id, str(t.meta.get("bucket", "")), t.num_turns, len(t.tool_calls), len(t.segments),
            sum(len(s) for s in t.segments), len(d), t.num_generated - len(d),
            sum(d) / len(d) if d else 0.0, max(d, default=0.0)))
    return report


def _diffs(model, t: Trajectory, version: int) -> list[float]:
    """|recomputed - recorded| log-prob of each policy token of `t` generated at `version`."""
    import torch

    out: list[float] = []
    device = next(model.parameters()).device
    for s in t.segments:
        at = [i for i in range(1, len(s)) if s.loss_mask[i] and s.versions[i] == version]
        if not at:
            continue
        ids = torch.tensor([s.token_ids], device=device)
        with torch.no_grad():
            logits = model(ids).logits[0].float()
        pos = torch.tensor(at, device=device)
        logp = torch.log_softmax(logits[pos - 1], dim=-1).gather(1, ids[0, pos, None])[:, 0]
        recorded = torch.tensor([s.logprobs[i] for i in at], device=device)
        out += (logp - recorded).abs().tolist()
    return out
