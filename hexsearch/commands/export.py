"""`hexsearch export RUN_DIR --out DIR [--adapter]`: a training run's policy as a Hugging Face folder.

    hexsearch export runs/train-20261204-164704 --out models/demo       # newest valid checkpoint, merged
    hexsearch export runs/train-.../checkpoints/step-20 --out models/s20 # one checkpoint
    hexsearch ask "..." engine.model=models/demo                         # then use it anywhere a model goes

The checkpoint is verified against its manifest first (trainer/checkpoint.py); only its weights are
read, nothing is unpickled (trainer/export.py). The run's own config.yaml says the base model and the
LoRA settings. `hexsearch ask` uses `demo_export()` to turn the newest `make demo` run into a model.
"""

from __future__ import annotations

from pathlib import Path

import typer
import yaml

from hexsearch.commands.common import UserError


def _as_user_error(call, *args, prefix: str = "", **kwargs):
    """`call` from trainer/export.py, its ExportError refusals turned into one-line user errors."""
    from trainer.export import ExportError

    try:
        return call(*args, **kwargs)
    except ExportError as e:
        raise UserError(f"{prefix}{e}") from None


def run_config(run: Path) -> dict:
    from trainer.export import run_config as read

    return _as_user_error(read, run)


def find_checkpoint(path: str | Path) -> tuple[Path, Path]:
    """(run folder, newest valid checkpoint) of a run folder or a checkpoint folder (trainer/export.py)."""
    from trainer.export import find_checkpoint as find

    return _as_user_error(find, path)


def export_run(path: str | Path, out: str | Path, *, adapter: bool = False, dtype: str = "bfloat16") -> Path:
    """`hexsearch export`: trainer.export.export_run, its refusals as one-line user errors."""
    from trainer.export import export_run as export

    return _as_user_error(export, path, out, adapter=adapter, dtype=dtype, prefix="export: ")


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
    from trainer.export import EXPORT_MARK

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

