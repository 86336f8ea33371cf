"""`hexsearch train CONFIG [key=value ...] [--resume RUN_DIR]`: asynchronous RL on Ray."""

from __future__ import annotations

from pathlib import Path

import typer

from hexsearch.commands.common import CONFIG_ARG, OVERRIDES_ARG, UserError, config_from_cli, open_run


def result_line(summary: dict) -> str:
    """The closing line every training run prints (read by `make demo` users and scripts)."""
    def fmt(x):
        return "nan" if x is None else f"{x:.3f}"
    return (f"RESULT train dev_reward_before={fmt(summary.get('dev_reward_before'))} "
            f"dev_reward_after={fmt(summary.get('dev_reward_after'))} steps={summary['steps']} "
            f"minutes={summary['minutes']:.1f}")


def run_training(config: str | None, overrides: list[str] | None, resume: str | None = None) -> dict:
    """Load the config (or the resumed run's own config), train, print the summary and RESULT line."""
    from core.log import setup_logging
    from core.rundir import RunDir

    if resume:
        run_path = Path(resume)
        if not (run_path / "config.yaml").exists():
            raise UserError(f"--resume {resume}: not a run folder (no config.yaml)")
        cfg = config_from_cli(str(run_path / "config.yaml"), overrides)
        run = RunDir(run_path)
    else:
        cfg = config_from_cli(config, overrides)
        run = open_run(cfg, "train")
    setup_logging(cfg.run.log_level, run.log)
    _check(cfg)
    from trainer.train import train

    typer.echo(f"run folder: {run.path}", err=True)
    _stop_on_sigterm()
    summary = train(cfg, run, resume=bool(resume))
    typer.echo(f"reward curve: {run.path / 'reward_curve.png'}", err=True)
    typer.echo(result_line(summary))
    return summary


def _stop_on_sigterm() -> None:
    """SIGTERM stops like Ctrl-C: Ray actors and the local Ray cluster are shut down, not orphaned."""
    import signal

    def _raise(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _raise)


def _check(cfg) -> None:
    """Fail before Ray starts on what would fail later. Fixed choices were checked when the config loaded;
    the staleness/concurrency ranges are the StalenessController's own check, run here early."""
    from trainer.staleness import StalenessController

    t = cfg.train
    if t.steps < 0:
        raise UserError(f"train.steps must be >= 0, got {t.steps}")
    try:
        StalenessController(t.max_staleness, t.batch_size, t.group_size, t.max_concurrent_episodes)
    except ValueError as e:
        raise UserError(f"train: {e}") from e


def register(app: typer.Typer) -> None:
    @app.command("train", help="Train a search agent with fully asynchronous RL (Ray). Ends with a RESULT line.")
    def _cmd(config: str = CONFIG_ARG, overrides: list[str] = OVERRIDES_ARG,
             resume: str = typer.Option(None, "--resume", help="Continue the run in this folder from its "
                                        "latest checkpoint (overrides apply on top of its config).")) -> None:
        run_training(config, overrides, resume)
