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
