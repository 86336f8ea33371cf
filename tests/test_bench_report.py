"""benchmarks/_common.py and _report.py: spreads, one JSON record per benchmark, RESULTS.md and the demo headline."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import _common  # noqa: E402
import _report  # noqa: E402


def test_spread_is_median_with_range():
    s = _common.spread([4.33, 2.58, 3.81])
    assert (s["median"], s["min"], s["max"], s["n"]) == (3.81, 2.58, 4.33, 3)
    assert _common.fmt(s) == "3.81 (2.58-4.33)" and _common.fmt(_common.spread([2.0])) == "2.00 (1 run)"
    assert _common.spread([1, 2, 3, 4])["median"] == 2.5
    # RESULT lines: every token is key=value, and the headline key carries the plain median
    assert _common.kv("ratio", s) == "ratio=3.81 ratio_range=2.58-4.33"
    assert _common.kv("ratio", _common.spread([2.0])) == "ratio=2.00 ratio_runs=1"
    assert _common.kv("vs_vllm", None) == "vs_vllm=nan" and _common.kv("n", 3.14159, 1) == "n=3.1"
    with pytest.raises(ValueError):
        _common.spread([])


def test_records_render_into_results_md(tmp_path, monkeypatch):
    rec = _common.write_result("demo_bench", "RESULT demo_bench ratio=3.10 range=2.60-4.30",
                               {"ratio": _common.spread([3.1, 2.6, 4.3])}, {"rounds": 3}, tmp_path / "demo_bench.json")
    data = json.loads(rec.read_text())
    assert data["benchmark"] == "demo_bench" and data["rounds"] == 3 and data["machine"]["cpus"] >= 1
    assert data["commit"] != "?"
    with pytest.raises(ValueError, match="must start with"):
        _common.write_result("other", "RESULT demo_bench ratio=1", {}, out=tmp_path / "x.json")
    (tmp_path / "old.json").write_text(json.dumps({"ratio": 9.23}))   # an older format: skipped, not fatal
    records = _report.load_records(tmp_path)
    assert [r["benchmark"] for r in records] == ["demo_bench"]
    runs = [{"run": i, "fresh_clone": fresh, "dev_reward_before": 0.367, "dev_reward_after": after, "steps": 20,
             "minutes": 13.0} for i, (after, fresh) in enumerate([(0.644, True), (0.9, False), (0.764, True), (0.694, True)])]
    md = _report.render(records, runs)
    assert "ratio=3.10 (2.60-4.30)" in md and "RESULT demo_bench ratio=3.10 range=2.60-4.30" in md
    # the headline is the median of the fresh-clone runs only (0.9 was not a fresh clone)
    assert "dev_reward_after **0.694 (0.644-0.764)** over 3 fresh-clone runs" in md


def test_demo_runs_file_names_a_bad_line(tmp_path):
    bad = tmp_path / "runs.jsonl"
    bad.write_text('{"dev_reward_after": 0.5}\n{oops\n')
    with pytest.raises(SystemExit, match="runs.jsonl:2"):
        _report.load_demo_runs(bad)


def test_shipped_demo_runs_parse():
    summary = _report.demo_summary(_report.load_demo_runs())
    assert summary is not None and summary["runs"] >= 4
    assert summary["dev_reward_after"]["min"] > summary["dev_reward_before"]["max"]
