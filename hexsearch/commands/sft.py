"""`hexsearch sft CONFIG [key=value ...]`: supervised fine-tuning on token-exact trajectories (trainer/sft.py).

    hexsearch sft configs/quickstart.yaml sft.source=oracle          # the world's chains, through the agent loop
    hexsearch sft configs/quickstart.yaml sft.source=rft             # the policy's own successful episodes
    hexsearch sft configs/quickstart.yaml sft.source=file sft.data=runs/big/trajectories/train.jsonl
    hexsearch sft --resume runs/<sft run> [sft.epochs=6 ...]         # go on from its kept (best) checkpoint
    hexsearch train configs/quickstart.yaml train.init_from=runs/<sft run>   # then RL from its best checkpoint
"""

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
    """The closing line of an SFT run."""
    def fmt(x):
        return "nan" if x is None else f"{x:.3f}"
    return (f"RESULT sft dev_reward_before={fmt(summary.get('dev_reward_before'))} "
            f"dev_reward_after={fmt(summary.get('dev_reward_after'))} "
            f"dev_accuracy_after={fmt(summary.get('dev_accuracy_after'))} steps={summary['steps']} "
            f"trajectories={summary['trajectories']} minutes={summary['minutes']:.1f}")


def run_sft(config: str | None, overrides: list[str] | None, resume: str | None = None) -> dict:
    """Load the config, check the data source, run SFT into a new run folder (or continue the one `resume`
    names), print the RESULT line."""
    from core.log import setup_logging
    from core.rundir import RunDir
    from trainer.sft import sft
    from trainer.sft_data import SFTDataError

    cfg = resumed_config(resume, config, overrides) if resume else config_from_cli(config, overrides)
    if resume:
        _check_resumable(resume, cfg)
    if cfg.sft.source == "file" and not cfg.sft.data:
        raise UserError("sft.source=file needs sft.data: a trajectories JSONL (e.g. runs/<run>/trajectories/train.jsonl)")
    if cfg.engine.backend != "embedded":
        raise UserError(f"sft: engine.backend={cfg.engine.backend} is not supported yet; the SFT stage samples and "
                        "evaluates with engine.backend=embedded (the RL run that follows may use any backend)")
    if cfg.sft.source != "file" and not resume:  # a file is taken whole; the weights pick questions to sample
        check_bucket_weights(cfg, "sft.bucket_weights", cfg.sft.bucket_weights)
    run = RunDir(Path(resume)) if resume else open_run(cfg, "sft")
    setup_logging(cfg.run.log_level, run.log)
    typer.echo(f"run folder: {run.path}", err=True)
    try:
        summary = sft(cfg, run, resume=bool(resume))
    except SFTDataError as e:
        raise UserError(str(e)) from None
    typer.echo(f"best checkpoint: step {summary['best_step']} (hexsearch export {run.path} --out DIR; "
               f"train.init_from={run.path})", err=True)
    typer.echo(result_line(summary))
    return summary


def _check_resumable(resume: str, cfg) -> None:
    """A resumed run replays its data order from run.seed and sft.batch_size: they stay as the run had them."""
    from hexsearch.config import load_config

    saved = load_config(str(Path(resume) / "config.yaml"), [])
    for key, now, then in (("run.seed", cfg.run.seed, saved.run.seed),
                           ("sft.batch_size", cfg.sft.batch_size, saved.sft.batch_size)):
        if now != then:
            raise UserError(f"sft --resume {resume}: {key}={now} differs from the run's {then}; the steps it "
                            f"goes on from drew their batches with {then}")


def register(app: typer.Typer) -> None:
    @app.command("sft", help="Supervised fine-tuning on token-exact trajectories (oracle, rft or a file): the "
                             "cold start before RL. Ends with a RESULT line.")
    def _cmd(config: str = CONFIG_ARG, overrides: list[str] = OVERRIDES_ARG,
             resume: str = typer.Option(None, "--resume", help="Go on with the SFT run in this folder from its kept "
                                        "(best) checkpoint, on the trajectories it trained on; overrides apply on "
                                        "top of its config (e.g. sft.epochs=6 to train longer).")) -> None:
        run_sft(config, overrides, resume)
