"""Evaluation runs: every question x n samples through the same workflow as training, resumable.

    data = load_suite("gaia", "gaia_text103.json")
    rows = await run_samples(cfg, run, data.items, engine=engine, workflow=workflow, judge=judge)

- One pass: all Q x n episodes are scheduled at once, at most `eval.concurrency` running. Sample j of
  question q is played with seed crc32("<run.seed>/<q>/<j>"), so a rerun or a resumed run samples
  the same way (n samples are n draws, not n reruns of the whole suite).
- Checkpoint: each finished sample appends one line to `results.jsonl` (flushed) and its trajectory
  to `trajectories/eval.jsonl`. A resumed run drops a torn last line and runs only the missing
  (question, sample) pairs, so a killed run loses at most the samples in flight and never repeats one.
- Scoring (`score_sample`): the rule-based scorers of the suite (eval/scorers.py) and, when
  configured, an LLM judge with the suite's published prompt (eval/judges.py; verdicts cached by
  judge model, prompt version, question, gold and prediction). `correct` is decided by
  `eval.primary`: the judge's verdict, or a scorer's score being 1.
- Budgets per question are the agent's (`agent.max_turns`, `max_generated_tokens`, `wall_clock_s`,
  `max_cost_usd`); the stop reason of every sample is recorded.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from dataclasses import replace
from typing import Any, TypeVar

from core.checkpoint import append_row, read_rows
from eval.config import EvalRunConfig
from eval.suites import get_suite


def scorers_for(cfg: EvalRunConfig) -> list[str]:
    """`eval.scorers`, else the suite's own (its record in eval.suites.SUITES)."""
    return list(cfg.eval.scorers) or list(get_suite(cfg.eval.suite).scorers)


def judge_prompt_name(cfg: EvalRunConfig) -> str | None:
    """The judge prompt of this run (None: no judge); `auto` is the suite's published one."""
    name = cfg.eval.judge
    if name == "auto":
        return get_suite(cfg.eval.suite).judge
    return None if name in ("none", "") else name


def primary_for(cfg: EvalRunConfig) -> str:
    """What decides correctness: `eval.primary`, else the judge when one is used, else the first scorer."""
    if cfg.eval.primary != "auto":
        return cfg.eval.primary
    return "judge" if judge_prompt_name(cfg) else scorers_for(cfg)[0]


def sample_seed(run_seed: int, qid: str, sample: int) -> int:
    return zlib.crc32(f"{run_seed}/{qid}/{sample}".encode()) & 0x7FFFFFFF


def eval_temperature(cfg: EvalRunConfig) -> float:
    """`eval.temperature`, or greedy for one sample and the agent's temperature for several."""
    if cfg.eval.temperature >= 0:
        return cfg.eval.temperature
    return 0.0 if cfg.eval.n == 1 else cfg.agent.temperature


# -- the checkpoint -------------------------------------------------------------------------------
# -- scoring ----------------------------------------------------------------------------------------
async def score_sample(prediction: str | None, golds: list[str], question: str, *, scorers: list[str],
                       judge: Any = None, primary: str = "em", keep_raw: bool = True) -> dict[str, Any]:
    """Scores, judge verdict and correctness of one prediction (what results.jsonl records). `keep_raw=False`
    (an encrypted suite): no judge output, which can quote the gold answer, whatever the judge returned."""
    from eval.scorers import score_all

    out: dict[str, Any] = {"scores": score_all(prediction, golds, scorers), "judge": None}
    if judge is not None and prediction is not None and golds:
        verdict = await judge.judge(question, list(golds), prediction)
        out["judge"] = {"correct": verdict.correct, "cached": verdict.cached, "attempts": verdict.attempts}
        if keep_raw:
            out["judge"]["raw"] = verdict.raw[-500:]
    if primary == "judge":
        out["correct"] = bool(out["judge"] and out["judge"]["correct"])
    else:
        out["correct"] = out["scores"].get(primary, 0.0) >= 1.0
    return out


def _group_fields(meta: dict[str, Any]) -> dict[str, Any]:
    """What reports group by, from the row's keys or FlashRAG's nested `metadata`."""
    nested = meta.get("metadata") if isinstance(meta.get("metadata"), dict) else {}
    merged = {**nested, **meta}
    return {k: merged[k] for k in ("level", "hops", "family", "n", "type", "topic", "source", "reasoning_types")
            if k in merged}


def _row(item: Any, sample: int, traj: Any, scored: dict[str, Any], seed: int) -> dict[str, Any]:
    meta = traj.meta or {}
    turns = meta.get("turns") or []
    return {"id": str(item.id), "sample": sample, "question": item.question, "gold": list(item.answers),
            "prediction": traj.prediction, **scored, "stop_reason": traj.stop_reason, "turns": traj.num_turns,
            "tool_calls": len(traj.tool_calls), "generated_tokens": meta.get("generated_tokens", 0),
            "prompt_tokens": sum(t.get("prompt_tokens", 0) for t in turns), "cost_usd": meta.get("cost_usd", 0.0),
            "seconds": round((traj.timings or {}).get("total", 0.0), 3), "seed": seed,
            "item_meta": _group_fields(item.meta or {}),
            "trajectory": f"trajectories/eval.jsonl#{item.id}/{sample}"}


async def run_samples(cfg: EvalRunConfig, run: Any, items: list[Any], *, engine: Any, workflow: Any,
                      judge: Any = None, on_sample: Any = None, plaintext: bool = True) -> list[dict[str, Any]]:
    """Play and score every missing (question, sample) pair; returns all rows of results.jsonl, in order.
    `plaintext=False` (an encrypted suite): questions, gold answers, the judge's output and trajectories are
    not written (build the judge with `keep_raw=False` too, so that its cache holds none either)."""
    results = run.path / "results.jsonl"
    done = {(r["id"], r["sample"]) for r in read_rows(results)}
    todo = [(item, j) for item in items for j in range(cfg.eval.n) if (str(item.id), j) not in done]
    scorers, primary = scorers_for(cfg), primary_for(cfg)
    sem = asyncio.Semaphore(max(1, cfg.eval.concurrency))
    traj_file = run.trajectories / "eval.jsonl"

    async def one(item: Any, sample: int) -> None:
        seed = sample_seed(cfg.run.seed, str(item.id), sample)
        async with sem:
            traj = await workflow.arun_episode(engine, item, seed=seed, request_id=f"eval/{item.id}/{sample}")
            scored = await score_sample(traj.prediction, list(item.answers), item.question, scorers=scorers,
                                        judge=judge, primary=primary, keep_raw=plaintext)
        traj.meta.update(key=f"{item.id}/{sample}", sample=sample)
        row = _row(item, sample, traj, scored, seed)
        if plaintext:
            append_row(traj_file, json.loads(traj.to_json()))
        else:
            row.update(question=None, gold=None, trajectory=None)
        append_row(results, row)  # the checkpoint: written last
        if on_sample is not None:
            on_sample()

    tasks = [asyncio.ensure_future(one(item, j)) for item, j in todo]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    order = {(str(item.id), j): i for i, (item, j) in enumerate((it, j) for it in items for j in range(cfg.eval.n))}
    rows = [r for r in read_rows(results) if (r["id"], r["sample"]) in order]
    return sorted(rows, key=lambda r: order[(r["id"], r["sample"])])


C = TypeVar("C", bound=EvalRunConfig)


def eval_workflow_config(cfg: C, run: Any) -> C:
    """The config the evaluation's workflow runs with: the eval temperature and, with `eval.tool_cache`,
    a tool cache in the run folder (a repeated or resumed run never re-queries the web)."""
    cfg = replace(cfg, agent=replace(cfg.agent, temperature=eval_temperature(cfg)))
    if cfg.eval.tool_cache:
        cfg = replace(cfg, tools=replace(cfg.tools, cache_enabled=True, cache_path=str(run.path / "tools.sqlite")))
    return cfg


def build_eval_judge(cfg: EvalRunConfig, engine: Any = None, *, keep_raw: bool = True) -> Any:
    """The LLM judge with the suite's published prompt (None when the run uses no judge). An embedded judge
    that is the policy model itself reuses the policy engine instead of loading a second copy. `keep_raw=False`
    (an encrypted suite without plaintext): the judge keeps none of its output, in memory or in its cache."""
    name = judge_prompt_name(cfg)
    if name is None:
        return None
    from agent.judge import build_judge
    from eval.config import JUDGE_KEYWORDS
    from eval.judges import JUDGE_PROMPTS, get_judge_prompt

    JUDGE_PROMPTS.check(name, JUDGE_KEYWORDS)
    prompt = get_judge_prompt(name)
    judge_cfg = cfg.agent.judge
    shared = (engine if judge_cfg.backend == "embedded" and cfg.engine.backend == "embedded"
              and judge_cfg.model == cfg.engine.model else None)
    return build_judge(judge_cfg, engine=shared, prompt=prompt, keep_raw=keep_raw)
