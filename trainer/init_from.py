"""`train.init_from: RUN_DIR`: start RL from another run's best weights (an SFT cold start, usually).

The run's newest valid checkpoint (for `hexsearch sft` the best one on dev: it keeps only that) is exported
once, merged and in fp32, to `<RUN_DIR>/artifacts/policy-step-N/` (trainer/export.py; reused when already there), and
that folder becomes `engine.model`. The learner and the engines then load it as they would any base model:
both start from the same weights, with a fresh optimizer, at version 0; the new run's config.yaml names the
folder, so `--resume` and `hexsearch export` of the RL run see the right base.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from trainer.config import FullConfig

C = TypeVar("C", bound=FullConfig)


def resolve_init_from(cfg: C) -> C:
    """`cfg` with `engine.model` set to the exported policy of `train.init_from` (unchanged when empty). Raises
    ValueError in one line when the folder is not a run with a valid checkpoint."""
    src = cfg.train.init_from
    if not src:
        return cfg
    from trainer.export import EXPORT_MARK, ExportError, export_run, find_checkpoint, run_config

    try:
        run, ckpt = find_checkpoint(src)
        base = (run_config(run).get("engine") or {}).get("model")
    except ExportError as e:
        raise ValueError(f"train.init_from: {e}") from None
    if not base:
        raise ValueError(f"train.init_from: {run}/config.yaml names no engine.model")
    out = run / "artifacts" / f"policy-{ckpt.name}"
    if not _exported(out, ckpt):
        if (out / EXPORT_MARK).exists():  # our export of another path: the run folder was copied or moved
            shutil.rmtree(out)
        export_run(ckpt, out, dtype="float32")
    return replace(cfg, engine=replace(cfg.engine, model=str(out.resolve())))


def _exported(out: Path, ckpt: Path) -> bool:
    from trainer.export import EXPORT_MARK

    try:
        info = json.loads((out / EXPORT_MARK).read_text())
    except (OSError, ValueError):
        return False
    return info.get("checkpoint") == str(ckpt.resolve()) and (out / "model.safetensors").exists()


# What decides a dev evaluation's figures besides the weights: these train fields and these whole sections
_EVAL_FIELDS = ("dev_data", "eval_questions", "eval_seed", "eval_temperature", "eval_suite")
_EVAL_SECTIONS = ("agent", "tools", "world", "engine")
# ... except: engine.model (ours names the export, theirs the base it trained from) and agent.temperature
# (the rollouts' sampling temperature; the evaluation samples at train.eval_temperature)
_NOT_EVALUATED = {"engine": ("model",), "agent": ("temperature",)}


def inherited_dev_eval(cfg: FullConfig) -> tuple[dict[str, float], str]:
    """(figures, where) of the dev evaluation `train.init_from`'s run logged for the checkpoint this run starts
    from, when the evaluation before training would repeat it: greedy (`train.eval_temperature` 0), and the
    same dev questions, agent, tools, world and engine settings (`engine.model` aside: it is that checkpoint's
    export; and `agent.temperature`: the evaluation's is `train.eval_temperature`). `hexsearch sft` keeps the
    checkpoint of its best evaluation, so its row is there; an RL checkpoint saved between evaluations has none.
    ({}, why not) otherwise. `cfg` is resolve_init_from's: the checkpoint is the one its export's mark names,
    the weights actually loaded (found and hashed once, there)."""
    t = cfg.train
    if not (t.init_from and t.reuse_init_eval):
        return {}, "train.reuse_init_eval is off" if t.init_from else "no train.init_from"
    if t.eval_temperature != 0:
        return {}, "the evaluation samples (train.eval_temperature > 0)"
    from trainer.export import EXPORT_MARK, ExportError, run_config
    from trainer.metrics import eval_row_at, read_metrics

    try:
        ckpt = Path(json.loads((Path(cfg.engine.model) / EXPORT_MARK).read_text())["checkpoint"])
        run = ckpt.parent.parent  # <run>/checkpoints/step-N
        theirs = run_config(run)
        step = int(json.loads((ckpt / "state.json").read_text())["loop"]["step"])
    except (ExportError, OSError, KeyError, TypeError, ValueError) as e:
        return {}, f"no readable checkpoint state ({e})"
    ours = _as_plain(cfg)
    for section in _EVAL_SECTIONS:
        a, b = dict(ours.get(section) or {}), dict(theirs.get(section) or {})
        for key in _NOT_EVALUATED.get(section, ()):
            a.pop(key, None)
            b.pop(key, None)
        if a != b:
            changed = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            return {}, f"{section} settings differ from {run}'s ({', '.join(changed)})"
    changed = [k for k in _EVAL_FIELDS if (ours.get("train") or {}).get(k) != (theirs.get("train") or {}).get(k)]
    if changed:
        return {}, f"train settings differ from {run}'s ({', '.join(changed)})"
    row = eval_row_at(read_metrics(run / "metrics.jsonl"), step)
    if row is None:
        return {}, f"{run} logged no dev evaluation at step {step}"
    # its time/eval_s stays out: row 0 of this run must not claim time it did not spend
    return {k: v for k, v in row.items() if k.startswith("eval/")}, f"{run} step {step}"


def _as_plain(cfg: FullConfig) -> dict:
    """The config as the plain dict its run's config.yaml reads back as (hexsearch.config.to_yaml)."""
    import yaml
    from omegaconf import OmegaConf

    return yaml.safe_load(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
