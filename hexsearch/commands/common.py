"""Helpers shared by CLI commands: one-line user errors, config + run-folder setup."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from core.rundir import RunDir
from hexsearch.config import ConfigError, HexConfig, load_config, to_yaml


class UserError(Exception):
    """An error the user can fix; printed as one line, exit code 2 (or `exit_code`)."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


CONFIG_ARG = typer.Argument(None, help="Config YAML (see configs/); omit for defaults.")
OVERRIDES_ARG = typer.Argument(None, help="key=value overrides with dotted paths, e.g. train.lr=1e-5")


def config_from_cli(config: str | None, overrides: list[str] | None) -> HexConfig:
    """Load a config, turning config errors into one-line user errors."""
    # `hexsearch train key=value` without a file: the first override arrives as `config`.
    if config is not None and "=" in config and not Path(config).exists():
        overrides, config = [config, *(overrides or [])], None
    try:
        return load_config(config, overrides or [])
    except ConfigError as e:
        raise UserError(str(e)) from e


def resumed_config(resume: str, config: str | None, overrides: list[str] | None) -> HexConfig:
    """`--resume RUN [key=value ...]`: the run folder's own config.yaml with the overrides on top. The first
    override arrives as `config` (the CLI's first positional), so it is taken back as one; a config file
    besides --resume is refused, since the run continues under the config it was started with."""
    if not (Path(resume) / "config.yaml").exists():
        raise UserError(f"--resume {resume}: not a run folder (no config.yaml)")
    if config is not None:
        if "=" not in config or Path(config).exists():
            raise UserError(f"--resume {resume} continues with the run's own config.yaml: give key=value overrides, "
                            f"not the config file {config}")
        overrides = [config, *(overrides or [])]
    return config_from_cli(str(Path(resume) / "config.yaml"), overrides)


def open_run(cfg: HexConfig, kind: str) -> RunDir:
    """Create the run folder for a command and save its resolved config there."""
    run = RunDir.create(cfg.run.root, cfg.run.name or None, kind=kind)
    run.config.write_text(to_yaml(cfg))
    return run


def print_json(obj) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))


def check_bucket_weights(cfg: HexConfig, key: str, weights: dict[str, int]) -> None:
    """`train.bucket_weights` / `sft.bucket_weights` must name buckets of the training questions, which only the
    data knows: checked here, before Ray or a run folder, as one line."""
    if not weights:
        return
    from trainer.runtime import load_questions, mix_buckets

    try:
        mix_buckets(load_questions(cfg)[0], weights)
    except ValueError as e:
        raise UserError(f"{key}: {e}") from None
