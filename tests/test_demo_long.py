"""`hexsearch demo-long` end to end on a tiny model and a tiny world: base evaluation, SFT cold start on
oracle episodes, async RL from it on Ray, and the held-out evaluation per bucket; the RESULT line's
figures come from the stages' own files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

TINY = ["engine.model=tiny-random", "world.entities=40", "world.lineages=6", "world.lineage_length=8",
        "world.lineage_depths=[2,4,8]", "sft.max_items=12", "sft.epochs=1", "sft.batch_size=6", "sft.eval_every=0",
        "train.eval_questions=6", "train.steps=2", "train.time_budget_min=0", "train.batch_size=2",
        "train.group_size=2", "train.filter_groups=none", "train.rollout_workers=1", "train.engine_replicas=1",
        # every bucket of this small world once; it has no N = 16 or 32 lineages, the recipe's mix asks N = 32
        "train.bucket_weights={hops1: 1, hops2: 1, hops3: 1, n2: 1, n4: 1, n8: 1, n32: 0}",
        "train.save_every=0", "train.max_inflight_trajectories=4", "agent.max_turns=12", "agent.max_tool_calls=10",
        "engine.max_batch_size=16"]


@pytest.fixture(scope="module")
def long_demo(tmp_path_factory) -> tuple[dict, Path]:
    from hexsearch.commands.demo_long import run_long_demo

    root = tmp_path_factory.mktemp("long")
    return run_long_demo("configs/long-horizon.yaml", [*TINY, f"run.root={root}", "run.name=lh"]), root


def table_text(summary: dict) -> str:
    from hexsearch.commands.demo_long import table

    return table(summary["tables"], summary["unseen_buckets"])


def test_demo_long_runs_every_stage_and_reports_per_bucket(long_demo):
    from hexsearch.commands.demo_long import result_line

    summary, tmp_path = long_demo
    line = result_line(summary)
    assert re.fullmatch(r"RESULT long_horizon base=\S+ sft=\S+ rl=\S+ acc_hops2_3=\S+ acc_n8=\S+ acc_n32=\S+ "
                        r"base_n32=\S+ tool_calls_first=\S+ tool_calls_last=\S+ max_turns=\d+ minutes=\S+", line)
    assert json.loads((tmp_path / "lh-summary.json").read_text())["rl"] == summary["rl"]
    assert Path(summary["code"]) == Path(__file__).resolve().parents[1]  # the tree whose commit is recorded
    # the recipe id: the YAML and its overrides without where it ran; another override is another recipe
    from hexsearch.commands.demo_long import recipe_id

    tiny = [*TINY, "run.name=other", "run.root=/elsewhere"]
    assert summary["recipe"] == recipe_id("configs/long-horizon.yaml", tiny)
    assert summary["recipe"] != recipe_id("configs/long-horizon.yaml", [*tiny, "train.lr=2e-5"])
    # the 3-hop recipe's test evaluations also ask the world's 4-hop test questions, which no stage trains on:
    # reported as their own column, left out of `overall` (the test split's own figure)
    assert summary["unseen_buckets"] == ["hops4"]
    test_ids = {json.loads(x)["id"] for x in (tmp_path / "lh-test.jsonl").read_text().splitlines()}
    sft_ids = {json.loads(x)["question_id"] for x in (Path(summary["runs"]["sft"]) / "trajectories" / "sft.jsonl")
               .read_text().splitlines()}
    assert not test_ids & sft_ids
    for stage in ("base", "sft", "rl"):
        table = summary["tables"][stage]
        assert {"n2", "n4", "n8", "hops1", "hops4"} <= set(table), table  # every bucket of the test split is reported
        assert 0.0 <= table["overall"] <= 1.0
        report = json.loads(Path(table["run"], "report.json").read_text())
        results = [json.loads(x) for x in Path(table["run"], "results.jsonl").read_text().splitlines()]
        seen = [r for r in results if not r["id"].endswith("-h4")]
        assert report["overall"]["questions"] == len(results) > len(seen) > 0
        assert table["overall"] == pytest.approx(sum(r["correct"] for r in seen) / len(seen))
    assert "hops4: never trained on, not in overall" in table_text(summary)
    # the stages chain: RL started from the SFT's exported best checkpoint, and evaluated its own weights
    rl_cfg = (Path(summary["runs"]["rl"]) / "config.yaml").read_text()
    assert "artifacts/policy-step-" in rl_cfg and summary["runs"]["sft"] in rl_cfg
    # the figures are the RL run's own: tool calls of its largest-N bucket, the most turns it trained on
    rows = [json.loads(x) for x in (Path(summary["runs"]["rl"]) / "metrics.jsonl").read_text().splitlines()]
    # RL's dev evaluation before training is the SFT stage's of the same weights (train.reuse_init_eval), not a
    # second one: the SFT run's row of its best step, and results.json says so
    sft = json.loads((Path(summary["runs"]["sft"]) / "results.json").read_text())
    sft_row = next(json.loads(x) for x in (Path(summary["runs"]["sft"]) / "metrics.jsonl").read_text().splitlines()
                   if json.loads(x)["step"] == sft["best_step"])
    assert rows[0]["step"] == 0 and rows[0]["eval/reward"] == sft_row["eval/reward"] == sft["dev_reward_after"]
    assert {k: v for k, v in rows[0].items() if k.startswith("eval/")} == {k: v for k, v in sft_row.items() if k.startswith("eval/")}
    rl = json.loads((Path(summary["runs"]["rl"]) / "results.json").read_text())
    assert rl["dev_eval_before_from"] == f"{summary['runs']['sft']} step {sft['best_step']}"
    assert rl["dev_reward_before"] == sft["dev_reward_after"]
    # it ran all its train.steps (no budget here), so nothing stopped it early
    assert rl["steps"] == summary["rl_steps"] == 2 and "stopped" not in rl and summary["rl_stopped"] == ""
    key = f"agent/tool_calls/{summary['bucket']}"
    assert summary["tool_calls_first"] == next(r[key] for r in rows if key in r)
    turns = [json.loads(x)["num_turns"] for p in (Path(summary["runs"]["rl"]) / "trajectories").glob("*.jsonl")
             for x in p.read_text().splitlines()]
    assert summary["max_turns"] == max(turns) > 0
    # ... and its longest trained episodes are token-exact under the weights that sampled them
    exact = summary["token_exact"]
    assert exact["ok"] and exact["checked"] > 0 and 0 in exact["versions"], exact
    assert exact["mean_diff"] <= exact["tolerance"] and 0 < exact["longest_turns"] <= summary["max_turns"]


def test_exported_long_horizon_policy_evaluates_on_any_local_qa_file(long_demo, tmp_path):
    """The command the held-out multi-hop check runs: the RL run's own config (its agent settings), a local-QA
    file and index of its own, the exported policy, greedy."""
    import subprocess
    import sys

    from fixtures.corpus import write_corpus

    summary = long_demo[0]
    hex_cli = [sys.executable, "-m", "hexsearch.cli"]
    corpus = write_corpus(tmp_path / "qa")
    index = tmp_path / "qa" / "index"
    built = subprocess.run([*hex_cli, "index", "build", "--corpus", str(corpus), "--out", str(index)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    docs = [json.loads(line) for line in corpus.read_text().splitlines()][:4]
    qa = tmp_path / "qa" / "q.jsonl"
    qa.write_text("".join(json.dumps({"id": f"q{i}", "question": f"What is {d['title']}?", "answer": d["title"]}) + "\n"
                          for i, d in enumerate(docs)))
    exported = tmp_path / "exported"
    out = subprocess.run([*hex_cli, "export", summary["runs"]["rl"], "--out", str(exported)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    out = subprocess.run([*hex_cli, "eval", f"{summary['runs']['rl']}/config.yaml", "--suite", "localqa", "--data",
                          str(qa), f"tools.index_dir={index}", f"engine.model={exported}", "agent.temperature=0",
                          f"run.root={tmp_path}", "run.name=heldout"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1].startswith("RESULT eval suite=localqa questions=4 ")
    assert not (tmp_path / "heldout" / "world.json").exists()


def test_a_rerun_reuses_finished_stages(long_demo, capsys):
    """Each stage is its own process and run folder; a rerun with the same run.name picks up after the last
    finished stage (here: all of them), with the same figures."""
    from hexsearch.commands.demo_long import run_long_demo

    summary, root = long_demo
    again = run_long_demo("configs/long-horizon.yaml", [*TINY, f"run.root={root}", "run.name=lh"])
    out = capsys.readouterr().out
    assert out.count("done already") == 5
    assert {k: again[k] for k in ("base", "sft", "rl", "max_turns", "stage_minutes")} == \
        {k: summary[k] for k in ("base", "sft", "rl", "max_turns", "stage_minutes")}
    # the first run's minutes are its wall clock, which holds the stages and the steps between them; a
    # resumed run has no whole wall clock and reports the stages' own times
    assert summary["minutes"] > summary["stage_minutes"] > 0
    assert again["minutes"] == summary["stage_minutes"]


def test_a_rerun_goes_on_with_an_sft_stage_stopped_after_its_checkpoint(long_demo, capsys):
    """An SFT stage killed after writing its checkpoint (no results.json yet) is not started again: the rerun
    resumes it (`hexsearch sft --resume`) and keeps the later stages, with the same figures."""
    from hexsearch.commands.demo_long import run_long_demo

    summary, root = long_demo
    results = root / "lh-sft" / "results.json"
    before = json.loads(results.read_text())
    results.unlink()
    again = run_long_demo("configs/long-horizon.yaml", [*TINY, f"run.root={root}", "run.name=lh"])
    out = capsys.readouterr().out
    assert "lh-sft: stopped after a checkpoint; going on from it" in out and out.count("done already") == 4
    after = json.loads(results.read_text())
    assert after["resumed_at_step"] == before["best_step"] == after["best_step"]
    assert after["dev_reward_after"] == before["dev_reward_after"] and after["trajectories"] == before["trajectories"]
    assert {k: again[k] for k in ("sft", "rl", "sft_best_step")} == {k: summary[k] for k in ("sft", "rl", "sft_best_step")}
