"""`hexsearch export RUN_DIR --out DIR [--adapter]`: a training run's policy as a Hugging Face folder.

    hexsearch export runs/train-20261204-164704 --out models/demo       # newest valid checkpoint, merged
    hexsearch export runs/train-.../checkpoints/step-20 --out models/s20 # one checkpoint
    hexsearch ask "..." engine.model=models/demo                         # then use it anywhere a model goes

The checkpoint is verified against its manifest first (trainer/checkpoint.py); only its weights are
read, nothing is unpickled (trainer/export.py). The run's own config.yaml says the base model and the
LoRA settings. `hexsearch ask` uses `demo_export()` to turn the newest `make demo` run into a model.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import typer
import yaml

from hexsearch.commands.common import UserError

EXPORT_MARK = "hexsearch_export.json"


def run_config(run: Path) -> dict:
    try:
        cfg = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise UserError(f"{run}: no readable config.yaml ({e})") from None
    return cfg if isinstance(cfg, dict) else {}


def find_checkpoint(path: str | Path) -> tuple[Path, Path]:
    """(run folder, newest valid checkpoint) of a run folder or of one `step-N` checkpoint folder."""
    from trainer import checkpoint

    p = Path(path)
    if (p / "state.json").exists():  # a checkpoint folder: runs/<run>/checkpoints/step-N
        problem = checkpoint.verify(p)
        if problem:
            raise UserError(f"{p}: not a valid checkpoint ({problem})")
        return p.parent.parent, p
    if not (p / "config.yaml").exists():
        raise UserError(f"{p}: not a run folder (no config.yaml) nor a checkpoint folder (no state.json)")
    ckpt = checkpoint.latest(p / "checkpoints")
    if ckpt is None:
        raise UserError(f"{p}: no valid checkpoint under {p / 'checkpoints'} (was it trained with train.save_every > 0?)")
    return p, ckpt


def export_run(path: str | Path, out: str | Path, *, adapter: bool = False, dtype: str = "bfloat16") -> Path:
    """Export a run's (or a checkpoint's) policy to `out`, written whole or not at all."""
    from trainer.export import ExportError, export_policy

    run, ckpt = find_checkpoint(path)
    cfg = run_config(run)
    model = (cfg.get("engine") or {}).get("model")
    if not model:
        raise UserError(f"{run}/config.yaml names no engine.model")
    t = cfg.get("train") or {}
    lora = (int(t["lora_rank"]), float(t.get("lora_alpha", 32.0)), list(t.get("lora_modules") or [])) \
        if int(t.get("lora_rank") or 0) > 0 else None
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise UserError(f"export: {out} exists and is not empty")
    tmp = out.with_name(f".{out.name}.tmp-{uuid.uuid4().hex[:6]}")
    try:
        export_policy(ckpt, model, tmp, lora=lora, adapter=adapter, dtype=dtype,
                      info={"run": str(run.resolve()), "step": ckpt.name})
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except ExportError as e:
        raise UserError(f"export: {e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def newest_demo_run(root: str | Path = "runs") -> Path | None:
    """The newest `make demo` run under `root` that has a checkpoint, or None: a `train-<time>` folder (the
    name `hexsearch demo` gives) trained with the quickstart's model and world."""
    from hexsearch.commands.demo import quickstart_path

    try:
        quick = yaml.safe_load(Path(quickstart_path()).read_text(encoding="utf-8"))
    except (UserError, OSError):
        return None
    root = Path(root)
    if not root.is_dir():
        return None
    found = []
    for run in root.glob("train-*"):
        pointer = run / "checkpoints" / "latest"
        if not (pointer.is_file() and (run / "config.yaml").is_file()):
            continue
        try:
            cfg = run_config(run)
        except UserError:
            continue
        engine, world = cfg.get("engine") or {}, cfg.get("world") or {}
        same = engine.get("model") == (quick.get("engine") or {}).get("model") and engine.get("backend") == "embedded"
        if same and all(world.get(f) == v for f, v in (quick.get("world") or {}).items()):
            found.append((pointer.stat().st_mtime, run))
    return max(found)[1] if found else None


def demo_export(run: Path) -> tuple[Path, str]:
    """The HF folder of `run`'s newest checkpoint, exported once into `<run>/artifacts/hf-<step>/` and
    reused while that checkpoint stays the newest; and the step's name."""
    step = (run / "checkpoints" / "latest").read_text().strip()
    folder = run / "artifacts" / f"hf-{step}"
    if not (folder / EXPORT_MARK).exists():
        _, ckpt = find_checkpoint(run)
        step = ckpt.name
        folder = run / "artifacts" / f"hf-{step}"
        if not (folder / EXPORT_MARK).exists():
            export_run(run, folder)
    return folder, step


def register(app: typer.Typer) -> None:
    @app.command("export", help="Write a training run's policy as a Hugging Face folder (safetensors, tokenizer, "
                                "chat template, generation config); LoRA merged unless --adapter.")
    def _cmd(run: str = typer.Argument(..., help="A run folder (its newest valid checkpoint) or a checkpoint folder."),
             out: str = typer.Option(..., "--out", help="The folder to write (must not exist or be empty)."),
             adapter: bool = typer.Option(False, "--adapter", help="LoRA runs: write the peft adapter, not merged weights."),
             dtype: str = typer.Option("bfloat16", "--dtype", help="bfloat16 | float16 | float32 (merged weights).")) -> None:
        if dtype not in ("bfloat16", "float16", "float32"):
            raise UserError(f"export: --dtype {dtype}: valid: bfloat16, float16, float32")
        folder = export_run(run, out, adapter=adapter, dtype=dtype)
        typer.echo(f"exported {folder} (use it as engine.model={folder}, or `hexsearch serve vllm --model {folder}`)")

