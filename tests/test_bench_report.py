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


def test_records_are_appended_and_render_into_results_md(tmp_path):
    records = tmp_path / "records.jsonl"
    for ratio in ([1.0, 1.1], [3.1, 2.6, 4.3]):  # two runs of one benchmark: the file keeps both
        rec = _common.write_result("demo_bench", f"RESULT demo_bench ratio={ratio[0]:.2f}",
                                   {"ratio": _common.spread(ratio)}, {"rounds": len(ratio)}, tmp_path / "demo_bench.json",
                                   records=records)
    data = json.loads(rec.read_text())
    assert data["benchmark"] == "demo_bench" and data["rounds"] == 3 and data["machine"]["cpus"] >= 1
    assert data["commit"] != "?"
    assert [json.loads(line) for line in records.read_text().splitlines()][-1] == data
    with pytest.raises(ValueError, match="must start with"):
        _common.write_result("other", "RESULT demo_bench ratio=1", {}, out=tmp_path / "x.json", records=records)
    rows = _report.load_records(records)
    assert len(rows) == 2 and [r["headline"]["ratio"]["n"] for r in _report.latest(rows)] == [3]
    runs = [{"run": i, "fresh_clone": fresh, "dev_reward_before": 0.367, "dev_reward_after": after, "steps": 20 + i,
             "minutes": 13.0, "commit": "abc1234", "machine": "2-core AVX2"}
            for i, (after, fresh) in enumerate([(0.644, True), (0.9, False), (0.764, True), (0.694, True)])]
    md = _report.render(rows, runs)
    assert "ratio=3.10 (2.60-4.30)" in md and "RESULT demo_bench ratio=3.10" in md and "ratio=1.00" not in md
    # the headline: a real run (the one nearest the median, named) beside the median of the fresh-clone runs
    # only (0.9 was not a fresh clone)
    assert "RESULT train dev_reward_before=0.367 dev_reward_after=0.694 steps=23 minutes=13.0" in md
    assert "That is run 3 of `benchmarks/demo_runs.jsonl`" in md
    assert "dev_reward_after **0.694 (0.644-0.764)**" in md and "all 3 fresh-clone runs" in md
    assert _report.render(rows, runs) == md  # nothing in it but the records: no date or commit of rendering


def test_records_file_names_a_bad_line(tmp_path):
    bad = tmp_path / "records.jsonl"
    bad.write_text('{"benchmark": "x"}\n')
    with pytest.raises(SystemExit, match="record 1 .x. lacks result_line"):
        _report.load_records(bad)
    bad.write_text('[1]\n')
    with pytest.raises(SystemExit, match="records.jsonl:1: not a JSON object"):
        _report.load_records(bad)


def test_a_run_that_did_not_gain_is_recordable(tmp_path):
    run = tmp_path / "train-x"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"dev_reward_before": 0.367, "dev_reward_after": 0.301,
                                                  "steps": 12, "minutes": 13.1}))
    runs = tmp_path / "demo_runs.jsonl"
    runs.write_text('{"run": 4, "fresh_clone": true, "dev_reward_before": 0.367, "dev_reward_after": 0.7, '
                    '"steps": 20, "minutes": 13.0}\n')
    row = _report.record_demo(run, fresh_clone=True, path=runs)
    assert row["run"] == 5 and row["dev_reward_after"] == 0.301
    summary = _report.demo_summary(_report.load_demo_runs(runs))
    assert summary["runs"] == 2 and summary["dev_reward_after"]["min"] == 0.301  # counted, not dropped


def test_results_md_and_the_readme_headline_are_what_the_records_give():
    """RESULTS.md and the README's demo block are generated: regenerating them from the committed records
    changes nothing (a hand edit, or a record added without regenerating, fails here)."""
    runs = _report.load_demo_runs()
    assert _report.RESULTS_MD.read_text() == _report.render(_report.load_records(), runs)
    readme = _report.README.read_text()
    assert _report.with_readme_block(readme, _report.readme_block(runs)) == readme
    assert _report.demo_line(_report.demo_summary(runs)["shown"]) in readme


def test_demo_runs_file_names_a_bad_line(tmp_path):
    bad = tmp_path / "runs.jsonl"
    bad.write_text('{"dev_reward_after": 0.5}\n{oops\n')
    with pytest.raises(SystemExit, match="runs.jsonl:2"):
        _report.load_demo_runs(bad)


def test_shipped_demo_runs_parse():
    summary = _report.demo_summary(_report.load_demo_runs())
    assert summary is not None and summary["runs"] >= 4
    assert summary["shown"] in _report.load_demo_runs()  # the headline is one of the recorded runs


def test_long_horizon_runs_are_recorded_and_rendered(tmp_path):
    figures = {"base": 0.02, "sft": 0.41, "rl": 0.38, "acc_hops2_3": 0.3, "acc_n8": 0.4, "acc_n32": 0.1,
               "base_n32": 0.0, "tool_calls_first": 7.5, "tool_calls_last": 9.25, "max_turns": 41, "minutes": 58.2}
    summary = tmp_path / "lh-summary.json"
    summary.write_text(json.dumps({**figures, "rl_steps": 9, "sft_best_step": 12, "tables": {"rl": {"n8": 0.4}}}))
    runs = tmp_path / "long.jsonl"
    first = _report.record_long(summary, fresh_clone=False, path=runs)
    second = _report.record_long(summary, fresh_clone=True, path=runs)
    assert (first["run"], second["run"]) == (1, 2) and second["rl"] == 0.38  # recorded whatever RL did
    text = "\n".join(_report.long_text(_report.load_long_runs(runs)))
    assert "| 2 |" in text and "rl 0.38 (0.38-0.38)" in text and "max_turns 41.00 (41.00-41.00)" in text
    assert "rl_gain -0.03 (-0.03--0.03)" in text and "| 0.380 | -0.030 | 0.300 |" in text  # rl - sft, per run
    assert _report.long_text([]) == []
    # the median is over the newest run's recipe only: a run of another recipe is listed, not pooled
    summary.write_text(json.dumps({**figures, "rl": 0.7, "recipe": "abc123"}))
    third = _report.record_long(summary, fresh_clone=True, path=runs)
    assert third["recipe"] == "abc123"
    text = "\n".join(_report.long_text(_report.load_long_runs(runs)))
    assert "| 3 | " in text and "Over the 1 recorded run(s) of recipe abc123" in text and "rl 0.70 (1 run)" in text
    summary.write_text(json.dumps({**figures, "rl": 0.5, "recipe": "abc123"}))
    _report.record_long(summary, fresh_clone=True, path=runs)
    text = "\n".join(_report.long_text(_report.load_long_runs(runs)))
    assert "Over the 2 recorded run(s) of recipe abc123 (the newest run's)" in text and "rl 0.60 (0.50-0.70)" in text
    # the recipe the repository runs now wins over the newest run's, when a run of it was recorded
    text = "\n".join(_report.long_text(_report.load_long_runs(runs), current="abc123"))
    assert "of recipe abc123 (configs/long-horizon.yaml now)" in text
    summary.write_text(json.dumps({**figures, "rl": 0.9, "recipe": "def456"}))
    _report.record_long(summary, fresh_clone=True, path=runs)
    text = "\n".join(_report.long_text(_report.load_long_runs(runs), current="abc123"))
    assert "Over the 2 recorded run(s) of recipe abc123 (configs/long-horizon.yaml now)" in text
    assert "rl 0.60 (0.50-0.70)" in text and "| 5 | " in text
    # a run of the same recipe on another kind of machine is listed and has its own median, not pooled
    other = {**json.loads(runs.read_text().splitlines()[-1]), "run": 6, "recipe": "abc123", "rl": 0.1,
             "machine": "64-core TEST"}
    with runs.open("a") as f:
        f.write(json.dumps(other) + "\n")
    text = "\n".join(_report.long_text(_report.load_long_runs(runs), current="abc123"))
    assert "| 6 | " in text and "rl 0.60 (0.50-0.70)" in text
    assert "Over the 1 recorded run(s) of recipe abc123 (configs/long-horizon.yaml now) on 64-core TEST, " \
           "median (min-max): base 0.02 (1 run), sft 0.41 (1 run), rl 0.10 (1 run)" in text
    from hexsearch.commands.demo_long import recipe_id

    assert _report.current_recipe() == recipe_id(_common.ROOT / "configs" / "long-horizon.yaml", [])


def test_a_long_horizon_run_records_the_commit_of_the_clone_it_ran_in(tmp_path):
    """`--record-long DIR/runs/x-summary.json` runs from this repository, but the code that ran is DIR's."""
    import subprocess

    clone = tmp_path / "clone"
    (clone / "runs").mkdir(parents=True)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(clone)]
    subprocess.run([*git, "init", "-q"], check=True)
    (clone / "f.txt").write_text("x")
    subprocess.run([*git, "add", "f.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "c"], check=True)
    sha = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    summary = clone / "runs" / "lh-summary.json"
    summary.write_text(json.dumps({"rl": 0.5}))
    row = _report.record_long(summary, fresh_clone=True, path=tmp_path / "long.jsonl")
    assert row["commit"] == sha != _common.commit()
    # a summary written under a run.root outside any clone names the source tree that ran
    elsewhere = tmp_path / "elsewhere" / "lh-summary.json"
    elsewhere.parent.mkdir()
    elsewhere.write_text(json.dumps({"rl": 0.5, "code": str(clone)}))
    assert _report.record_long(elsewhere, fresh_clone=False, path=tmp_path / "long.jsonl")["commit"] == sha
