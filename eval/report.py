"""Reports of an evaluation run: report.json, report.md, plots, and the comparison of two runs.

Per question q with n samples of which c_q are correct (eval/runner.py decides `correct`):

    Avg@n      = mean_q c_q / n                      (the expected accuracy of one sample)
    Pass@k     = mean_q 1 - C(n - c_q, k) / C(n, k)  (unbiased, from the same n samples; k <= n)
    Maj@n      = mean_q [the most frequent prediction of q is correct]
    <scorer>   = mean over samples of the scorer (gaia, em, f1, ...)

Everything is reported for the whole suite and per group: GAIA level, question hops, topic. Cost
figures (turns, tool calls, generated and prompt tokens, dollars, seconds) are means per sample, and
stop reasons are counted. The judge model and prompt version are part of every report.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from eval.stats import bootstrap_diff, majority_vote, pass_at_k

COST_FIELDS = ("turns", "tool_calls", "generated_tokens", "prompt_tokens", "cost_usd", "seconds")
GROUP_KEYS = ("level", "hops", "bucket", "topic")
"""Item fields a report is broken down by; `bucket` is agent.qa.question_bucket (`hops2`, `n8`, ...)."""


def _by_question(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        out[r["id"]].append(r)
    return out


def summarize(rows: list[dict[str, Any]], ks: list[int]) -> dict[str, Any]:
    """The figures of the module docstring for a set of result rows."""
    questions = _by_question(rows)
    if not questions:
        return {"questions": 0, "samples": 0}
    n = min(len(v) for v in questions.values())
    out: dict[str, Any] = {"questions": len(questions), "samples": len(rows), "n": n}
    out[f"avg@{n}"] = sum(sum(r["correct"] for r in v) / len(v) for v in questions.values()) / len(questions)
    for k in ks:
        if k <= n:
            out[f"pass@{k}"] = sum(pass_at_k(len(v), sum(r["correct"] for r in v), k)
                                   for v in questions.values()) / len(questions)
    maj = 0
    for v in questions.values():
        winner = majority_vote([r["prediction"] for r in v])
        maj += any(r["correct"] for r in v if r["prediction"] == winner) if winner is not None else 0
    out[f"maj@{n}"] = maj / len(questions)
    names = sorted({k for r in rows for k in r.get("scores", {})})
    out["scores"] = {s: sum(r["scores"].get(s, 0.0) for r in rows) / len(rows) for s in names}
    judged = [r for r in rows if r.get("judge")]
    if judged:
        out["judge_unparsed"] = sum(r["judge"]["correct"] is None for r in judged)
    out["mean"] = {f: sum(float(r.get(f, 0) or 0) for r in rows) / len(rows) for f in COST_FIELDS}
    out["stop_reasons"] = dict(Counter(r["stop_reason"] for r in rows).most_common())
    return out


def _with_bucket(row: dict[str, Any]) -> dict[str, Any]:
    from agent.qa import question_bucket

    meta = row.get("item_meta") or {}
    bucket = question_bucket(meta)
    return row if bucket is None or "bucket" in meta else {**row, "item_meta": {**meta, "bucket": bucket}}


def build_report(rows: list[dict[str, Any]], *, suite: str, ks: list[int], info: dict[str, Any]) -> dict[str, Any]:
    """report.json: the whole suite, each group, and the run's settings (`info`: judge, model, skipped, ...)."""
    report = {"suite": suite, **info, "overall": summarize(rows, ks), "groups": {}}
    rows = [_with_bucket(r) for r in rows]
    for key in GROUP_KEYS:
        values = sorted({str(r["item_meta"][key]) for r in rows if key in r.get("item_meta", {})})
        if len(values) > 1 or (values and key == "level"):
            report["groups"][key] = {v: summarize([r for r in rows if str(r["item_meta"].get(key)) == v], ks)
                                     for v in values}
    return report


def _pct(x: Any) -> str:
    return f"{100 * x:.1f}" if isinstance(x, float) else str(x)


def report_markdown(report: dict[str, Any]) -> str:
    """report.md: the headline table, per-group tables, cost and stop reasons."""
    o = report["overall"]
    metric_keys = [k for k in o if "@" in k]
    lines = [f"# Evaluation: {report['suite']}", ""]
    for key in ("model", "judge_model", "judge_prompt", "primary", "temperature", "data", "skipped"):
        if report.get(key) not in (None, ""):
            lines.append(f"- {key}: {report[key]}")
    lines += ["", "| group | questions | " + " | ".join(metric_keys + list(o.get("scores", {}))) + " |",
              "|---" * (2 + len(metric_keys) + len(o.get("scores", {}))) + "|"]

    def row(name: str, s: dict[str, Any]) -> str:
        cells = [_pct(s.get(k, "")) for k in metric_keys] + [_pct(s.get("scores", {}).get(k, "")) for k in o["scores"]]
        return f"| {name} | {s.get('questions', 0)} | " + " | ".join(cells) + " |"

    lines.append(row("all", o))
    for key, groups in report["groups"].items():
        lines += [row(f"{key}={v}", s) for v, s in groups.items()]
    lines += ["", "Mean per sample: " + ", ".join(f"{k} {v:.2f}" for k, v in o["mean"].items()),
              "", "Stop reasons: " + ", ".join(f"{k} {v}" for k, v in o["stop_reasons"].items()), ""]
    return "\n".join(lines)


def plot_accuracy(rows: list[dict[str, Any]], path: Path) -> None:
    """Accuracy against turns and against generated tokens (samples binned by each)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, field in zip(axes, ("turns", "generated_tokens"), strict=True):
        values = sorted(r.get(field, 0) for r in rows)
        if not values:
            continue
        edges = sorted({values[int(i * (len(values) - 1) / 8)] for i in range(9)})
        xs, ys = [], []
        for lo, hi in zip(edges, edges[1:] + [float("inf")], strict=True):
            part = [r for r in rows if lo <= r.get(field, 0) < hi]
            if part:
                xs.append(sum(r.get(field, 0) for r in part) / len(part))
                ys.append(sum(r["correct"] for r in part) / len(part))
        ax.plot(xs, ys, marker="o")
        ax.set_xlabel(field.replace("_", " "))
        ax.set_ylabel("accuracy")
        ax.set_ylim(0, 1)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_report(run_path: Path, rows: list[dict[str, Any]], *, suite: str, ks: list[int],
                 info: dict[str, Any]) -> dict[str, Any]:
    report = build_report(rows, suite=suite, ks=ks, info=info)
    (run_path / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False))
    (run_path / "report.md").write_text(report_markdown(report))
    if rows:
        plot_accuracy(rows, run_path / "accuracy.png")
    return report


def compare_runs(rows_a: list[dict[str, Any]], rows_b: list[dict[str, Any]], *, iters: int = 2000,
                 seed: int = 0) -> dict[str, Any]:
    """B against A on the questions both ran: per-question accuracy (mean over samples), the difference
    B - A with a paired bootstrap 95% interval, and the questions that flipped (majority correct in one
    run only)."""
    qa, qb = _by_question(rows_a), _by_question(rows_b)
    common = [q for q in qa if q in qb]
    acc_a = [sum(r["correct"] for r in qa[q]) / len(qa[q]) for q in common]
    acc_b = [sum(r["correct"] for r in qb[q]) / len(qb[q]) for q in common]
    diff, lo, hi = bootstrap_diff(acc_b, acc_a, iters=iters, seed=seed) if common else (0.0, 0.0, 0.0)
    gained = [q for q, a, b in zip(common, acc_a, acc_b, strict=True) if a < 0.5 <= b]
    lost = [q for q, a, b in zip(common, acc_a, acc_b, strict=True) if b < 0.5 <= a]
    return {"questions": len(common), "only_a": len(qa) - len(common), "only_b": len(qb) - len(common),
            "accuracy_a": sum(acc_a) / max(len(common), 1), "accuracy_b": sum(acc_b) / max(len(common), 1),
            "diff": diff, "ci95": [lo, hi], "gained": gained, "lost": lost}
