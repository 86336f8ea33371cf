"""Report of a QA-synthesis run: report.json, report.md and the RESULT line.

Built from the run's items (datagen/record.py), accepted and rejected, plus what later stages add:

    items        attempted, accepted, rejected, acceptance_rate = accepted / attempted
    rejections   rejected items per stage (the part of `reason` before ":") and per failing check
                 (the first failed check of the item's last edit, when it has one)
    checks       per check name: ran, passed, pass_rate, over every check of every edit
    actions      per action (base, fuzz, inject): edits attempted, accepted, acceptance_rate
    hops         {hops: accepted items}; difficulty {"k/n": accepted items} of the final question
    edits_per_accepted   mean number of accepted edits (base included) of an accepted item
    usage        calls, tokens and dollars in total and per accepted question; item seconds summed
    dataset      the near-duplicate removal and split summary (datagen/dataset.py), or null
    ground_truth the summary of the check against the world (datagen/ground_truth.py `summarise`),
                 or null; `verified_fraction` is the headline, its other keys are its components
    examples     the first accepted and rejected items by index (an accepted one carries its
                 ground-truth check, when there is one)

Histogram keys are strings, so report.json reads back equal to the returned report.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from core.checkpoint import write_atomic
from datagen.record import CHECKS

ACTIONS: tuple[str, ...] = ("base", "fuzz", "inject")
USAGE_FIELDS: tuple[str, ...] = ("calls", "prompt_tokens", "completion_tokens", "cost_usd")


def _rate(num: int, den: int) -> float | None:
    return num / den if den else None


def _stage(reason: str) -> str:
    """The stage of a rejection reason `<stage>: <why>`."""
    return reason.split(":", 1)[0].strip() or "unknown"


def _ending_check(item: dict[str, Any]) -> str | None:
    """The name of the first failed check of the edit that ended a rejected item, if any."""
    edits = item.get("edits") or []
    if not edits:
        return None
    failed = next((c for c in edits[-1].get("checks") or [] if not c["passed"]), None)
    return failed["name"] if failed else None


def _difficulty_key(d: dict[str, Any] | None) -> str:
    return f"{d['correct']}/{d['attempts']}" if d else "n/a"


def _sorted_hist(counts: Counter[str], order: Any) -> dict[str, int]:
    return {k: counts[k] for k in sorted(counts, key=order)}


def _difficulty_order(key: str) -> tuple[int, int, int]:
    if key == "n/a":
        return (1, 0, 0)
    k, n = key.split("/")
    return (0, int(n), int(k))


def _check_table(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    ran: Counter[str] = Counter()
    passed: Counter[str] = Counter()
    for item in items:
        for edit in item.get("edits") or []:
            for check in edit.get("checks") or []:
                ran[check["name"]] += 1
                passed[check["name"]] += bool(check["passed"])
    names = list(CHECKS) + sorted(set(ran) - set(CHECKS))
    return {n: {"ran": ran[n], "passed": passed[n], "pass_rate": _rate(passed[n], ran[n])} for n in names}


def _action_table(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    tried: Counter[str] = Counter()
    kept: Counter[str] = Counter()
    for item in items:
        for edit in item.get("edits") or []:
            tried[edit["action"]] += 1
            kept[edit["action"]] += bool(edit["accepted"])
    names = list(ACTIONS) + sorted(set(tried) - set(ACTIONS))
    return {a: {"attempted": tried[a], "accepted": kept[a], "acceptance_rate": _rate(kept[a], tried[a])}
            for a in names}


def _usage(items: list[dict[str, Any]], accepted: int) -> dict[str, Any]:
    total = {f: sum((item.get("usage") or {}).get(f, 0) for item in items) for f in USAGE_FIELDS}
    total["cost_usd"] = float(total["cost_usd"])
    per = {f: v / accepted for f, v in total.items()} if accepted else None
    return {"total": total, "per_accepted": per,
            "seconds": float(sum(item.get("seconds", 0.0) or 0.0 for item in items))}


def _examples(items: list[dict[str, Any]], ground_truth: dict[str, Any] | None, n: int) -> dict[str, list]:
    per_item = (ground_truth or {}).get("per_item") or {}
    accepted = [{"id": it["id"], "question": it["question"], "answer": it["answer"], "hops": it["hops"],
                 "difficulty": _difficulty_key(it.get("difficulty")), "pages": list(it.get("pages") or [])}
                | ({"ground_truth": per_item[it["id"]]} if it["id"] in per_item else {})
                for it in items if it["status"] == "accepted"][:n]
    rejected = [{"id": it["id"], "question": it.get("question", ""), "answer": it.get("answer", ""),
                 "reason": it.get("reason", "")}
                for it in items if it["status"] != "accepted"][:n]
    return {"accepted": accepted, "rejected": rejected}


def build_report(items: list[dict[str, Any]], *, dataset: dict[str, Any] | None = None,
                 ground_truth: dict[str, Any] | None = None, info: dict[str, Any] | None = None,
                 examples: int = 5) -> dict[str, Any]:
    """report.json: the figures of the module docstring for a run's items (accepted and rejected)."""
    items = sorted(items, key=lambda it: it["index"])
    accepted = [it for it in items if it["status"] == "accepted"]
    rejected = [it for it in items if it["status"] != "accepted"]
    by_check = Counter(name for it in rejected if (name := _ending_check(it)))
    return {
        "info": dict(info or {}),
        "items": {"attempted": len(items), "accepted": len(accepted), "rejected": len(rejected),
                  "acceptance_rate": _rate(len(accepted), len(items))},
        "rejections": {"by_stage": dict(Counter(_stage(it.get("reason", "")) for it in rejected).most_common()),
                       "by_check": dict(by_check.most_common())},
        "checks": _check_table(items),
        "actions": _action_table(items),
        "hops": _sorted_hist(Counter(str(it["hops"]) for it in accepted), int),
        "edits_per_accepted": _rate(sum(sum(bool(e["accepted"]) for e in it.get("edits") or [])
                                        for it in accepted), len(accepted)),
        "difficulty": _sorted_hist(Counter(_difficulty_key(it.get("difficulty")) for it in accepted),
                                   _difficulty_order),
        "usage": _usage(items, len(accepted)),
        "dataset": dataset,
        "ground_truth": ground_truth["summary"] if ground_truth else None,
        "examples": _examples(items, ground_truth, examples),
    }


def _cell(x: Any) -> str:
    """A markdown table cell: `|` escaped, newlines flattened."""
    return " ".join(str(x).split()).replace("|", "\\|")


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _num(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4f}" if x < 1 else f"{x:.1f}"
    return str(x)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    return lines + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows] + [""]


def _verified(report: dict[str, Any]) -> float | None:
    return (report.get("ground_truth") or {}).get("verified_fraction")


def _agrees(check: dict[str, Any] | None) -> str:
    return "unchecked" if check is None else "agrees" if check.get("agrees") else "disagrees"


def _info_value(v: Any) -> str:
    return ", ".join(f"{k}={x}" for k, x in v.items()) if isinstance(v, dict) else str(v)


def _headline(report: dict[str, Any]) -> str:
    i, ds = report["items"], report["dataset"]
    parts = [f"attempted {i['attempted']}", f"accepted {i['accepted']} ({_pct(i['acceptance_rate'])})"]
    if ds:
        parts.append(f"kept {ds['kept']}")
    parts.append(f"verified {_pct(_verified(report))}" if report["ground_truth"] else "verified n/a")
    return "**" + " · ".join(parts) + "**"


def _dataset_lines(ds: dict[str, Any]) -> list[str]:
    dups = ds.get("duplicates") or []
    kinds = Counter(d.get("kind", "?") for d in dups)
    lines = ["## Dataset", "",
             f"Accepted {ds.get('accepted', 0)}, kept {ds.get('kept', 0)}, near-duplicates removed {len(dups)}"
             + (" (" + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) + ")" if dups else "") + ".", ""]
    splits = ds.get("splits") or {}
    if splits:
        lines += _table(["split", "questions"], [[k, v] for k, v in splits.items()])
    if dups:
        lines += _table(["removed", "duplicate of", "kind", "similarity"],
                        [[d["id"], d["duplicate_of"], d.get("kind", ""), _num(d.get("similarity", ""))]
                         for d in dups])
    return lines


def _ground_truth_lines(gt: dict[str, Any] | None) -> list[str]:
    lines = ["## Ground truth", ""]
    if not gt:
        return lines + ["Verified against the world: n/a (no ground truth for this corpus).", ""]
    lines += [f"Verified against the world: {_pct(gt.get('verified_fraction'))} "
              f"({gt.get('verified', 0)} of {gt.get('items', 0)} items)", ""]
    parts = [[k, _pct(v) if isinstance(v, float) or v is None else v] for k, v in gt.items()
             if k not in ("verified", "verified_fraction", "items")]
    return lines + (_table(["component", "value"], parts) if parts else [])


def render_markdown(report: dict[str, Any]) -> str:
    """report.md: headline, run info, tables of checks, actions and rejections, hops and difficulty,
    usage, dataset, ground truth, examples."""
    lines = ["# QA synthesis report", "", _headline(report), ""]
    lines += [f"- {k}: {_cell(_info_value(v))}" for k, v in report["info"].items() if v not in (None, "")]
    lines += ["", "## Checks", ""]
    lines += _table(["check", "ran", "passed", "pass rate"],
                    [[n, c["ran"], c["passed"], _pct(c["pass_rate"])] for n, c in report["checks"].items()])
    lines += ["## Actions", ""]
    lines += _table(["action", "attempted", "accepted", "acceptance"],
                    [[a, c["attempted"], c["accepted"], _pct(c["acceptance_rate"])]
                     for a, c in report["actions"].items()])
    rej = report["rejections"]
    lines += ["## Rejections", ""]
    lines += _table(["stage", "items"], list(map(list, rej["by_stage"].items())))
    if rej["by_check"]:
        lines += _table(["failing check", "items"], list(map(list, rej["by_check"].items())))
    epa = report["edits_per_accepted"]
    lines += ["## Accepted questions", "",
              f"Accepted edits per accepted question: {'n/a' if epa is None else f'{epa:.2f}'}", ""]
    lines += _table(["hops", "questions"], list(map(list, report["hops"].items())))
    lines += _table(["difficulty (solved/tries)", "questions"], list(map(list, report["difficulty"].items())))
    u = report["usage"]
    per = u["per_accepted"] or {}
    lines += ["## Usage", ""]
    lines += _table(["", *USAGE_FIELDS],
                    [["total", *(_num(u["total"][f]) for f in USAGE_FIELDS)],
                     ["per accepted question", *(_num(per[f]) if per else "n/a" for f in USAGE_FIELDS)]])
    lines += [f"Item seconds (summed): {u['seconds']:.1f}", ""]
    if report["dataset"]:
        lines += _dataset_lines(report["dataset"])
    lines += _ground_truth_lines(report["ground_truth"])
    ex = report["examples"]
    lines += ["## Examples", "", "Accepted:", ""]
    world = report["ground_truth"] is not None
    lines += _table(["id", "question", "answer", "hops", "difficulty", "pages"] + ["world"] * world,
                    [[e["id"], e["question"], e["answer"], e["hops"], e["difficulty"], ", ".join(e["pages"])]
                     + [_agrees(e.get("ground_truth"))] * world for e in ex["accepted"]])
    lines += ["Rejected:", ""]
    lines += _table(["id", "question", "answer", "reason"],
                    [[e["id"], e["question"], e["answer"], e["reason"]] for e in ex["rejected"]])
    return "\n".join(lines)


def write_report(out_dir: str | Path, items: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    """Write report.json and report.md into `out_dir` (each atomically) and return the report;
    `kw` are build_report's keywords."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = build_report(items, **kw)
    write_atomic(out / "report.json", json.dumps(report, indent=2, ensure_ascii=False))
    write_atomic(out / "report.md", render_markdown(report))
    return report


def result_line(report: dict[str, Any]) -> str:
    """`RESULT datagen attempted=.. accepted=.. kept=.. acceptance=.. verified=.. tokens=.. minutes=..`;
    kept is the accepted count when no dataset was built, verified `n/a` without ground truth."""
    i, ds, total = report["items"], report["dataset"], report["usage"]["total"]
    verified = _verified(report)
    return (f"RESULT datagen attempted={i['attempted']} accepted={i['accepted']} "
            f"kept={ds['kept'] if ds else i['accepted']} acceptance={i['acceptance_rate'] or 0.0:.3f} "
            f"verified={'n/a' if verified is None else f'{verified:.3f}'} "
            f"tokens={total['prompt_tokens'] + total['completion_tokens']} "
            f"minutes={float(report['info'].get('seconds') or 0.0) / 60:.1f}")
