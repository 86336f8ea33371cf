"""`hexsearch check-logprobs RUN_DIR`: are the run's trained trajectories token-exact?

    hexsearch check-logprobs runs/l128-rl --min-turns 100        # the longest episodes past 100 turns
    hexsearch check-logprobs runs/lh4-rl --limit 0 --json        # every saved trajectory, as JSON

Each policy token's recorded behaviour log-prob is compared with a fresh forward pass of the weights that
sampled it (trainer/logprob_check.py). Exit 0 when the mean difference is within the tolerance, 1 when not,
2 when the run cannot be checked.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from hexsearch.commands.common import UserError


def register(app: typer.Typer) -> None:
    opt = typer.Option

    @app.command("check-logprobs", help="Re-score a run's saved trajectories with the weights that sampled "
                                        "them; compare with the log-probs the engine recorded.")
    def _cmd(run: str = typer.Argument(..., help="A training run folder (config.yaml, trajectories/)."),
             trajectories: str = opt("", "--trajectories", help="Another trajectories JSONL of this run."),
             min_turns: int = opt(0, "--min-turns", help="Only episodes of at least this many turns."),
             limit: int = opt(8, "--limit", help="Check the N longest episodes (0: all)."),
             complete: bool = opt(False, "--complete", help="Only episodes whose every weight version the run "
                                                            "still has (version 0, kept checkpoints)."),
             dtype: str = opt("", "--dtype", help="auto | bfloat16 | float16 | float32 (default: the run's "
                                                  "engine.dtype)."),
             tolerance: float = opt(-1.0, "--tolerance", help="Largest mean |difference| that passes "
                                                              "(default: 1e-3 in fp32, 5e-2 in bf16/fp16)."),
             threads: int = opt(0, "--threads", help="Torch CPU threads (0: torch's default)."),
             as_json: bool = opt(False, "--json", help="Print the whole report as JSON.")) -> None:
        from trainer.logprob_check import CheckError, check_run

        try:
            report = check_run(Path(run), trajectories=Path(trajectories) if trajectories else None,
                               min_turns=min_turns, limit=limit, complete=complete, dtype=dtype or None,
                               tolerance=tolerance if tolerance >= 0 else None, threads=threads)
        except (CheckError, ValueError) as e:
            raise UserError(f"check-logprobs: {e}") from None
        if as_json:
            typer.echo(json.dumps(report.as_dict(), indent=1))
        else:
            for e in report.episodes:
                typer.echo(f"{e.question_id} {e.bucket or '-'}: {e.turns} turns, {e.tool_calls} calls, "
                           f"{e.segments} segments, {e.tokens} tokens; {e.checked} policy tokens checked "
                           f"({e.unchecked} of versions without weights), |diff| mean {e.mean_diff:.2e} "
                           f"max {e.max_diff:.2e}")
            verdict = "token-exact" if report.ok else "NOT token-exact"
            typer.echo(f"{verdict}: {len(report.episodes)} episodes, {report.checked} policy tokens at versions "
                       f"{report.versions} ({report.dtype}), |diff| mean {report.mean_diff:.2e} "
                       f"max {report.max_diff:.2e}, tolerance {report.tolerance:.0e}")
        if not report.ok:
            raise typer.Exit(1)
