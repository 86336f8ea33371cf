"""`hexsearch train CONFIG [key=value ...] [--resume RUN_DIR]`: asynchronous RL on Ray."""

from __future__ import annotations

from pathlib import Path

import typer

from hexsearch.commands.common import (
    CONFIG_ARG,
    OVERRIDES_ARG,
    UserError,
    check_bucket_weights,
    config_from_cli,
    open_run,
    resumed_config,
)


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

    cfg = resumed_config(resume, config, overrides) if resume else config_from_cli(config, overrides)
    _check(cfg)  # before a run folder is made: a bad config leaves nothing behind
    cfg = _init_from(cfg)  # before the run folder too: its config.yaml names the policy it starts from
    run = RunDir(Path(resume)) if resume else open_run(cfg, "train")
    setup_logging(cfg.run.log_level, run.log)
    from trainer.train import train

    typer.echo(f"run folder: {run.path}", err=True)
    _stop_on_sigterm()
    summary = train(cfg, run, resume=bool(resume))
    typer.echo(f"reward curve: {run.path / 'reward_curve.png'}", err=True)
    typer.echo(result_line(summary))
    return summary


def _init_from(cfg):
    """`train.init_from`: engine.model becomes that run's best policy, exported once (trainer/init_from.py)."""
    from trainer.init_from import resolve_init_from

    try:
        return resolve_init_from(cfg)
    except ValueError as e:
        raise UserError(str(e)) from None


def _stop_on_sigterm() -> None:
    """SIGTERM stops like Ctrl-C: Ray actors and the local Ray cluster are shut down, not orphaned."""
    import signal

    def _raise(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _raise)


def _check(cfg) -> None:
    """Fail before Ray starts on what would fail later. Fixed choices and value ranges were checked when the
    config loaded (core/ranges.py); the staleness/concurrency relation is the StalenessController's own
    check, run here early; the QA files are read once so a bad row is a one-line error."""
    from agent.qa import DataError, load_qa

    t = cfg.train
    _check_staleness(cfg)
    if t.weight_transfer == "nccl":  # vLLM's trainer side must import in this (the learners') Python
        from serving.remote.weight_transfer import check_nccl

        try:
            check_nccl(cfg.engine.backend)
        except (ValueError, RuntimeError) as e:
            raise UserError(str(e)) from None
    for key, path in (("train.data", t.data), ("train.dev_data", t.dev_data if not t.eval_suite else "")):
        if path:
            try:
                load_qa(path)
            except DataError as e:  # a missing file or a bad row: one line naming the file and line
                raise UserError(f"{key}: {e}") from None
    check_bucket_weights(cfg, "train.bucket_weights", t.bucket_weights)


def dry_run(config: str | None, overrides: list[str] | None, gpu: str, gpus_per_node: int) -> bool:
    """Print the placement, memory per device, trajectories in flight and predicted speed (trainer/dry_run.py);
    no Ray, no GPU, no run folder. Returns whether everything fits."""
    from trainer.dry_run import dry_run as plan_run

    cfg = config_from_cli(config, overrides)
    _check_staleness(cfg)
    try:
        result = plan_run(cfg, gpu=gpu, gpus_per_node=gpus_per_node)
    except ValueError as e:
        raise UserError(str(e)) from None
    for line in result.lines():
        typer.echo(line)
    return result.fits


def _check_staleness(cfg) -> None:
    from trainer.staleness import StalenessController

    t = cfg.train
    try:
        StalenessController(t.max_staleness, t.batch_size, t.group_size, t.max_inflight_trajectories)
    except ValueError as e:
        raise UserError(f"train: {e}") from e


def register(app: typer.Typer) -> None:
    @app.command("train", help="Train a search agent with fully asynchronous RL (Ray). Ends with a RESULT line.")
    def _cmd(config: str = CONFIG_ARG, overrides: list[str] = OVERRIDES_ARG,
             resume: str = typer.Option(None, "--resume", help="Continue the run in this folder from its "
                                        "latest checkpoint (overrides apply on top of its config)."),
             dry: bool = typer.Option(False, "--dry-run", help="Print the placement (Ray bundles per node), memory "
                                      "per device by role, trajectories in flight and predicted tokens/s and step time, "
                                      "without Ray or a GPU; exit 1 when something does not fit."),
             gpu: str = typer.Option("H100", "--gpu", help="--dry-run: GPU type of the nodes (configs/planner/gpus.yaml) "
                                     "when the config has no plan.cluster."),
             gpus_per_node: int = typer.Option(8, "--gpus-per-node", help="--dry-run: GPUs per node.")) -> None:
        if dry:
            if not dry_run(config, overrides, gpu, gpus_per_node):
                raise typer.Exit(1)
            return
        run_training(config, overrides, resume)
