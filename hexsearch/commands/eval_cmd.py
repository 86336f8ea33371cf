"""`hexsearch eval`: evaluate an agent on a suite, rescore predictions, compare runs.

    hexsearch eval --suite world                                    # the offline world's test split
    hexsearch eval configs/eval_gaia.yaml --data gaia.json --n 4 --k 1,4 --limit 20 engine.backend=vllm ...
    hexsearch eval --resume runs/eval-20261204-101500                # finish a killed run, no sample twice
    hexsearch eval score --suite gaia --predictions preds.jsonl --out scored.jsonl
    hexsearch eval compare runs/eval-a runs/eval-b

A run plays every question n times through the workflow training uses (`train.workflow`), scores
each sample and writes `results.jsonl`, `report.json`, `report.md` and `accuracy.png` into its run
folder: eval/evaluate.py does the work, this file parses options and prints. It ends with one line
`RESULT eval suite=<s> questions=<q> avg@n=<x> pass@k=<y> ...`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup

from hexsearch.commands.common import (
    CONFIG_ARG,
    OVERRIDES_ARG,
    UserError,
    config_from_cli,
    open_run,
    resumed_config,
)


class _EvalGroup(TyperGroup):
    """`hexsearch eval [CONFIG] [options]` runs an evaluation; `score` and `compare` are subcommands."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h")):
            args = ["run", *args]
        return super().parse_args(ctx, args)


eval_app = typer.Typer(cls=_EvalGroup, help="Evaluate an agent on benchmark suites (GAIA, xBench-DeepSearch, "
                       "BrowseComp, Frames, local QA, the offline world); rescore predictions; compare runs.")


def _overrides(suite: str | None, data: str | None, n: int | None, k: str | None, limit: int | None) -> list[str]:
    out = []
    if suite:
        out.append(f"eval.suite={suite}")
    if data:
        out.append(f"eval.data={data}")
    if n is not None:
        out.append(f"eval.n={n}")
    if k:
        out.append(f"eval.k=[{k}]")
    if limit is not None:
        out.append(f"eval.limit={limit}")
    return out


def result_line(report: dict[str, Any]) -> str:
    o = report["overall"]
    figures = " ".join(f"{k}={o[k]:.3f}" for k in o if "@" in k)
    return f"RESULT eval suite={report['suite']} questions={o.get('questions', 0)} {figures}".rstrip()


@eval_app.command("run", help="Evaluate an agent on a suite; also what `hexsearch eval [CONFIG] [--suite ...]` runs.")
def run_eval(
    config: str = CONFIG_ARG, overrides: list[str] = OVERRIDES_ARG,
    suite: str = typer.Option(None, "--suite", help="A suite name (`hexsearch config keys eval.suite` lists them) "
                              "or pkg.mod:attr naming an eval.suites.Suite."),
    data: str = typer.Option(None, "--data", help="The suite's data file."),
    n: int = typer.Option(None, "--n", help="Samples per question (drawn in one pass)."),
    k: str = typer.Option(None, "--k", help="Comma-separated k for Pass@k, e.g. 1,4 (each <= n)."),
    limit: int = typer.Option(None, "--limit", help="Only the first N questions."),
    resume: str = typer.Option(None, "--resume", help="Finish the run in this folder (no sample runs twice)."),
) -> None:
    from core.log import setup_logging
    from core.rundir import RunDir
    from eval.evaluate import evaluate

    flags = _overrides(suite, data, n, k, limit)
    if resume:
        cfg = resumed_config(resume, config, [*(overrides or []), *flags])
        run = RunDir(Path(resume))
    else:
        cfg = config_from_cli(config, [*(overrides or []), *flags])
        run = open_run(cfg, "eval")
    setup_logging(cfg.run.log_level, run.log)
    typer.echo(f"run folder: {run.path}", err=True)
    try:
        report = asyncio.run(evaluate(cfg, run))
    except (ValueError, FileNotFoundError) as e:
        raise UserError(f"eval: {e}") from None
    typer.echo((run.path / "report.md").read_text())
    typer.echo(result_line(report))


@eval_app.command("score", help="Score a predictions JSONL ({id, question, answer, prediction} per line) with "
                                "the suite's rules (and its judge when one is configured).")
def score(
    suite: str = typer.Option(..., "--suite", help="Whose rules: a suite name or pkg.mod:attr."),
    predictions: str = typer.Option(..., "--predictions", help="JSONL with id, question, answer, prediction."),
    out: str = typer.Option(..., "--out", help="Output JSONL: the same lines, in order, with `score` added."),
    config: str = CONFIG_ARG, overrides: list[str] = OVERRIDES_ARG,
    judge: str = typer.Option("none", "--judge", help="auto (the suite's judge), none, or a judge prompt name."),
) -> None:
    from eval.evaluate import score_rows

    cfg = config_from_cli(config, [*(overrides or []), f"eval.suite={suite}", f"eval.judge={judge}"])
    rows = _read_predictions(Path(predictions))
    try:
        scored = asyncio.run(score_rows(cfg, rows))
    except (ValueError, FileNotFoundError) as e:
        raise UserError(f"eval score: {e}") from None
    with open(out, "w", encoding="utf-8") as f:
        for row in scored:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    correct = sum(r["correct"] for r in scored)
    typer.echo(f"RESULT eval_score suite={suite} rows={len(scored)} correct={correct} "
               f"accuracy={correct / max(len(scored), 1):.4f}")


def _read_predictions(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        raise UserError(f"--predictions {path}: no such file")
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise UserError(f"{path}:{i}: not valid JSON ({e})") from None
        missing = [k for k in ("answer", "prediction") if k not in row]
        if not isinstance(row, dict) or missing:
            raise UserError(f"{path}:{i}: needs keys id, question, answer, prediction (missing: {', '.join(missing)})")
        rows.append(row)
    return rows


@eval_app.command("compare", help="Compare two evaluation runs: accuracy difference with a bootstrap 95% "
                                  "interval and the questions that flipped.")
def compare(run_a: str = typer.Argument(..., help="The baseline run folder."),
            run_b: str = typer.Argument(..., help="The run compared with it.")) -> None:
    from core.checkpoint import read_rows
    from eval.report import compare_runs

    rows = []
    for path in (run_a, run_b):
        results = Path(path) / "results.jsonl"
        if not results.exists():
            raise UserError(f"{path}: not an evaluation run folder (no results.jsonl)")
        rows.append(read_rows(results))
    cmp = compare_runs(rows[0], rows[1])
    typer.echo(f"questions in both: {cmp['questions']} (only in A: {cmp['only_a']}, only in B: {cmp['only_b']})")
    typer.echo(f"accuracy A {cmp['accuracy_a']:.3f}  B {cmp['accuracy_b']:.3f}  B - A {cmp['diff']:+.3f} "
               f"(95% bootstrap interval {cmp['ci95'][0]:+.3f} .. {cmp['ci95'][1]:+.3f})")
    typer.echo(f"gained ({len(cmp['gained'])}): {', '.join(cmp['gained'][:20])}")
    typer.echo(f"lost ({len(cmp['lost'])}): {', '.join(cmp['lost'][:20])}")
    typer.echo(json.dumps({k: v for k, v in cmp.items() if k not in ("gained", "lost")}))


def register(app: typer.Typer) -> None:
    app.add_typer(eval_app, name="eval")
