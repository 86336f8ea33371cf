"""One evaluation run and one rescoring, end to end; `hexsearch eval` only parses options and prints.

    report = await evaluate(cfg, run)          # plays, scores, writes results.jsonl and the report
    rows = await score_rows(cfg, predictions)  # a predictions file scored by the suite's rules

`evaluate` reads the suite (eval/suites.py), builds the engine, the training workflow and the suite's
judge, plays every question n times (eval/runner.py), then writes `report.json`, `report.md` and
`accuracy.png` (eval/report.py). Problems with the config or the data raise ValueError (DataError,
ComponentError), FileNotFoundError for a missing file: the caller turns them into one-line messages.
"""

from __future__ import annotations

from typing import Any

from eval.config import EvalRunConfig
from eval.rows import SuiteData


def load_data(cfg: EvalRunConfig) -> SuiteData:
    """The items of `eval.suite` from `eval.data` (the configured world when empty), at most `eval.limit`."""
    from eval.suites import load_suite

    return load_suite(cfg.eval.suite, cfg.eval.data or None, limit=cfg.eval.limit or None, world_config=cfg.world)


def check_ks(cfg: EvalRunConfig) -> None:
    """Each `eval.k` is in 1..eval.n (Pass@k needs n >= k samples)."""
    for k in cfg.eval.k:
        if not 1 <= k <= cfg.eval.n:
            raise ValueError(f"eval.k: {k} is not between 1 and eval.n={cfg.eval.n} (Pass@k needs n >= k samples)")


async def _close(*objs: Any) -> None:
    for obj in objs:
        close = getattr(obj, "aclose", None)
        if close is not None:
            await close()


async def evaluate(cfg: EvalRunConfig, run: Any) -> dict[str, Any]:
    """Evaluate the configured agent on `eval.suite` into the run folder `run` (a core.rundir.RunDir;
    resumable: samples already in its results.jsonl are not played again); returns the report."""
    from agent.workflow import make_workflow
    from core.progress import progress
    from eval.report import write_report
    from eval.runner import (
        build_eval_judge,
        eval_temperature,
        eval_workflow_config,
        judge_prompt_name,
        primary_for,
        run_samples,
    )
    from serving.factory import build_engine
    from world import with_world_index

    cfg, world = with_world_index(cfg)  # the world's index when the local search has none (as training)
    data = load_data(cfg)
    check_ks(cfg)
    run_cfg = eval_workflow_config(cfg, run)
    plaintext = cfg.eval.write_plaintext or not data.encrypted
    engine = build_engine(cfg.engine)
    workflow = make_workflow(run_cfg, world_dir=world)
    judge = build_eval_judge(cfg, engine, keep_raw=plaintext)
    try:
        with progress(f"eval {cfg.eval.suite}", total=len(data.items) * cfg.eval.n) as bar:
            rows = await run_samples(run_cfg, run, data.items, engine=engine, workflow=workflow, judge=judge,
                                     on_sample=lambda: bar.advance(1), plaintext=plaintext)
    finally:
        await workflow.aclose()
        await _close(judge, engine)
    judge_info = judge.describe() if judge is not None else {}
    prompt = judge_prompt_name(cfg)
    info = {"model": cfg.engine.model, "backend": cfg.engine.backend, "data": cfg.eval.data, "n": cfg.eval.n,
            "temperature": eval_temperature(cfg), "primary": primary_for(cfg), "source": data.source,
            "judge_prompt": prompt and f"{prompt} ({judge_info.get('prompt_version')})",
            "judge_model": judge_info.get("model"), "skipped": len(data.skipped), "workflow": cfg.train.workflow}
    if data.skipped:
        run.write_json(run.path / "skipped.json", data.skipped)
    return write_report(run.path, rows, suite=cfg.eval.suite, ks=list(cfg.eval.k), info=info)


async def score_rows(cfg: EvalRunConfig, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each `{id, question, answer, prediction}` row with `score` (the primary's), `scores`, `correct` and the
    judge's verdict added, scored by the suite's rules and, when configured, its judge."""
    from eval.runner import build_eval_judge, primary_for, score_sample, scorers_for

    judge = build_eval_judge(cfg)
    primary, scorers = primary_for(cfg), scorers_for(cfg)
    try:
        out = []
        for row in rows:
            golds = row["answer"] if isinstance(row["answer"], list) else [str(row["answer"])]
            pred = row["prediction"] if row["prediction"] is None else str(row["prediction"])
            scored = await score_sample(pred, golds, str(row.get("question", "")), scorers=scorers,
                                        judge=judge, primary=primary)
            value = float(scored["correct"]) if primary == "judge" else scored["scores"][primary]
            out.append({**row, "score": value, "scores": scored["scores"], "correct": scored["correct"],
                        **({"judge": scored["judge"]} if scored["judge"] else {})})
        return out
    finally:
        await _close(judge)
