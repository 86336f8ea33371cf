"""datagen/report.py on hand-built items: counts, rates, histograms, rejections, markdown, files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from datagen.record import CheckResult, Edit, to_dict
from datagen.report import build_report, render_markdown, result_line, write_report


def _edit(action: str, accepted: bool, checks: str) -> dict[str, Any]:
    """An edit whose checks are given as `name+` (passed) / `name-` (failed), space separated."""
    return to_dict(Edit(action=action, accepted=accepted, question=f"{action} q", answer="a",
                        checks=[CheckResult(name=c[:-1], passed=c[-1] == "+", reason="" if c[-1] == "+" else "no")
                                for c in checks.split()]))


def _item(index: int, status: str, *, reason: str = "", edits: list[dict[str, Any]] | None = None,
          question: str = "", answer: str = "", hops: int = 0, pages: list[str] | None = None,
          difficulty: tuple[int, int] | None = None, usage: tuple[int, int, int, float] = (0, 0, 0, 0.0),
          seconds: float = 0.0) -> dict[str, Any]:
    calls, prompt, completion, cost = usage
    return {
        "id": f"dg-{index:06d}", "index": index, "seed_url": f"world://p{index}", "status": status,
        "reason": reason, "question": question, "answer": answer, "aug_answer": [], "hops": hops,
        "pages": pages or [], "statements": [], "edits": edits or [],
        "difficulty": {"correct": difficulty[0], "attempts": difficulty[1], "predictions": []} if difficulty else None,
        "search": None, "models": {"generator": "g", "solver": "s", "judge": "j"},
        "usage": {"calls": calls, "prompt_tokens": prompt, "completion_tokens": completion, "cost_usd": cost},
        "seconds": seconds,
    }


BASE_OK = "guard+ validity+ difficulty+ uniqueness+"

ITEMS = [
    # given out of index order: the report orders by index
    _item(4, "accepted", question="Which of Varn | Zetre lies on the Topar?", answer="Zetre", hops=1,
          pages=["world://p4"], difficulty=(0, 4), usage=(4, 400, 80, 0.003), seconds=8.0,
          edits=[_edit("base", True, BASE_OK + " search+")]),
    _item(0, "accepted", question="Who founded the city where X was born?", answer="Dalia Orrent", hops=2,
          pages=["world://p0", "world://p7"], difficulty=(1, 4), usage=(10, 1000, 200, 0.01), seconds=30.0,
          edits=[_edit("base", True, BASE_OK),
                 _edit("fuzz", False, "guard+ validity-"),
                 _edit("fuzz", True, "guard+ validity+ difficulty+"),
                 _edit("inject", True, "guard+ validity+ coverage+ difficulty+ uniqueness+")]),
    _item(1, "rejected", reason="base: validity: the answer does not follow", question="Q1?", answer="A1",
          usage=(2, 300, 50, 0.002), seconds=5.0, edits=[_edit("base", False, "guard+ validity-")]),
    _item(2, "rejected", reason="extract: no usable facts on the page", usage=(1, 100, 10, 0.0005), seconds=1.0),
    _item(3, "rejected", reason="inject: coverage: already covered", question="Q3?", answer="A3",
          usage=(5, 600, 100, 0.005), seconds=12.0,
          edits=[_edit("base", True, BASE_OK), _edit("fuzz", False, "guard+ validity+ difficulty-"),
                 _edit("inject", False, "guard+ validity+ coverage-")]),
]
DATASET = {"accepted": 2, "kept": 1, "splits": {"train": 1, "dev": 0, "test": 0},
           "duplicates": [{"id": "dg-000004", "duplicate_of": "dg-000000", "kind": "question", "similarity": 0.93}]}
GROUND_TRUTH = {  # the shape of datagen/ground_truth.py: summarise() and check() per item
    "summary": {"items": 2, "verified": 1, "verified_fraction": 0.5, "answer_supported": 2,
                "answer_supported_fraction": 1.0, "statements_supported_mean": 0.75, "hops_measured": 0,
                "hops_measured_fraction": 0.0, "hops_agree": 0, "hops_agree_fraction": None},
    "per_item": {"dg-000000": {"answer_supported": True, "statements_supported": 1.0, "world_hops": None,
                               "hops_agree": None, "agrees": True},
                 "dg-000004": {"answer_supported": True, "statements_supported": 0.5, "world_hops": None,
                               "hops_agree": None, "agrees": False}}}
INFO = {"models": {"generator": "g", "solver": "s", "judge": "j"}, "corpus": "world", "seconds": 150.0}


@pytest.fixture
def report() -> dict[str, Any]:
    return build_report(ITEMS, dataset=DATASET, ground_truth=GROUND_TRUTH, info=INFO)


def test_item_counts_and_rejections(report: dict[str, Any]) -> None:
    assert report["items"] == {"attempted": 5, "accepted": 2, "rejected": 3, "acceptance_rate": 0.4}
    assert report["rejections"]["by_stage"] == {"base": 1, "extract": 1, "inject": 1}
    # only the last edit counts (dg-000003 failed difficulty on a fuzz before coverage ended it);
    # the extract rejection has no edit, so no failing check
    assert report["rejections"]["by_check"] == {"validity": 1, "coverage": 1}


def test_checks_over_every_edit(report: dict[str, Any]) -> None:
    checks = report["checks"]
    assert list(checks) == ["guard", "validity", "difficulty", "uniqueness", "coverage", "search"]
    assert checks["guard"] == {"ran": 9, "passed": 9, "pass_rate": 1.0}
    assert checks["validity"] == {"ran": 9, "passed": 7, "pass_rate": pytest.approx(7 / 9)}
    assert checks["difficulty"] == {"ran": 6, "passed": 5, "pass_rate": pytest.approx(5 / 6)}
    assert checks["uniqueness"] == {"ran": 4, "passed": 4, "pass_rate": 1.0}
    assert checks["coverage"] == {"ran": 2, "passed": 1, "pass_rate": 0.5}
    assert checks["search"] == {"ran": 1, "passed": 1, "pass_rate": 1.0}


def test_actions_hops_difficulty(report: dict[str, Any]) -> None:
    assert report["actions"] == {
        "base": {"attempted": 4, "accepted": 3, "acceptance_rate": 0.75},
        "fuzz": {"attempted": 3, "accepted": 1, "acceptance_rate": pytest.approx(1 / 3)},
        "inject": {"attempted": 2, "accepted": 1, "acceptance_rate": 0.5},
    }
    assert list(report["hops"].items()) == [("1", 1), ("2", 1)]
    assert report["edits_per_accepted"] == pytest.approx(2.0)  # (3 + 1) accepted edits over 2 questions
    assert list(report["difficulty"].items()) == [("0/4", 1), ("1/4", 1)]


def test_usage(report: dict[str, Any]) -> None:
    usage = report["usage"]
    assert usage["total"]["calls"] == 22
    assert usage["total"]["prompt_tokens"] == 2400
    assert usage["total"]["completion_tokens"] == 440
    assert usage["total"]["cost_usd"] == pytest.approx(0.0205)
    assert usage["per_accepted"]["calls"] == pytest.approx(11.0)
    assert usage["per_accepted"]["prompt_tokens"] == pytest.approx(1200.0)
    assert usage["per_accepted"]["cost_usd"] == pytest.approx(0.01025)
    assert usage["seconds"] == pytest.approx(56.0)


def test_summaries_and_examples(report: dict[str, Any]) -> None:
    assert report["dataset"] == DATASET
    assert report["ground_truth"] == GROUND_TRUTH["summary"]
    assert report["info"]["corpus"] == "world"
    acc, rej = report["examples"]["accepted"], report["examples"]["rejected"]
    assert [e["id"] for e in acc] == ["dg-000000", "dg-000004"]
    assert acc[0] == {"id": "dg-000000", "question": "Who founded the city where X was born?",
                      "answer": "Dalia Orrent", "hops": 2, "difficulty": "1/4",
                      "pages": ["world://p0", "world://p7"],
                      "ground_truth": GROUND_TRUTH["per_item"]["dg-000000"]}
    assert [(e["id"], e["reason"]) for e in rej] == [
        ("dg-000001", "base: validity: the answer does not follow"),
        ("dg-000002", "extract: no usable facts on the page"),
        ("dg-000003", "inject: coverage: already covered"),
    ]
    one = build_report(ITEMS, examples=1)["examples"]
    assert [e["id"] for e in one["accepted"]] == ["dg-000000"]
    assert [e["id"] for e in one["rejected"]] == ["dg-000001"]


def test_markdown(report: dict[str, Any]) -> None:
    md = render_markdown(report)
    assert "**attempted 5 · accepted 2 (40.0%) · kept 1 · verified 50.0%**" in md
    assert "| check | ran | passed | pass rate |" in md
    assert "| validity | 9 | 7 | 77.8% |" in md
    assert "| coverage | 2 | 1 | 50.0% |" in md
    assert "| action | attempted | accepted | acceptance |" in md
    assert "| fuzz | 3 | 1 | 33.3% |" in md
    assert "| stage | items |" in md and "| extract | 1 |" in md
    assert "| failing check | items |" in md and "| coverage | 1 |" in md
    assert "| hops | questions |" in md and "| 2 | 1 |" in md
    assert "| total | 22 | 2400 | 440 | 0.0205 |" in md
    assert "near-duplicates removed 1 (question 1)" in md
    assert "| train | 1 |" in md
    assert "Verified against the world: 50.0% (1 of 2 items)" in md
    assert "| answer_supported_fraction | 100.0% |" in md and "| answer_supported | 2 |" in md
    assert "| statements_supported_mean | 75.0% |" in md and "| hops_agree_fraction | n/a |" in md
    assert "| verified_fraction |" not in md  # the headline, not a component
    assert ("| dg-000000 | Who founded the city where X was born? | Dalia Orrent | 2 | 1/4 | "
            "world://p0, world://p7 | agrees |") in md
    assert "| Zetre | 1 | 0/4 | world://p4 | disagrees |" in md
    assert "Which of Varn \\| Zetre lies on the Topar?" in md  # `|` escaped in the examples table
    assert "| dg-000002 |  |  | extract: no usable facts on the page |" in md


def test_result_line(report: dict[str, Any]) -> None:
    assert result_line(report) == ("RESULT datagen attempted=5 accepted=2 kept=1 acceptance=0.400 "
                                   "verified=0.500 tokens=2840 minutes=2.5")


def test_without_ground_truth_or_dataset() -> None:
    report = build_report(ITEMS)
    assert report["ground_truth"] is None and report["dataset"] is None
    assert "ground_truth" not in report["examples"]["accepted"][0]
    md = render_markdown(report)
    assert "Verified against the world: n/a" in md
    assert "verified n/a" in md and "## Dataset" not in md
    assert "| id | question | answer | hops | difficulty | pages |\n" in md  # no world column
    assert result_line(report) == ("RESULT datagen attempted=5 accepted=2 kept=2 acceptance=0.400 "
                                   "verified=n/a tokens=2840 minutes=0.0")


def test_no_items() -> None:
    report = build_report([])
    assert report["items"] == {"attempted": 0, "accepted": 0, "rejected": 0, "acceptance_rate": None}
    assert report["edits_per_accepted"] is None and report["usage"]["per_accepted"] is None
    assert report["checks"]["guard"] == {"ran": 0, "passed": 0, "pass_rate": None}
    assert "| guard | 0 | 0 | n/a |" in render_markdown(report)
    assert result_line(report).startswith("RESULT datagen attempted=0 accepted=0 kept=0 acceptance=0.000 ")


def test_write_report(tmp_path: Path) -> None:
    out = tmp_path / "run"
    report = write_report(out, ITEMS, dataset=DATASET, ground_truth=GROUND_TRUTH, info=INFO)
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md"]
    assert json.loads((out / "report.json").read_text()) == report
    assert (out / "report.md").read_text() == render_markdown(report)
    assert report["items"]["accepted"] == 2
