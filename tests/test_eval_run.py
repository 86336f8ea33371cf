"""`hexsearch eval` end to end: a local QA suite on an index the test builds (embedded model), a killed run
that resumes with every sample exactly once, a web suite against the fixture web server (scripted model:
the test decides its searches and answer), rescoring a predictions file, and comparing two runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures.corpus import write_corpus
from fixtures.web import SERPER_KEY, FixtureWeb

from core.checkpoint import read_rows
from core.rundir import RunDir
from eval.report import compare_runs, summarize, write_report
from eval.runner import run_samples

HEX = [sys.executable, "-m", "hexsearch.cli"]
TINY = ["engine.model=tiny-random", "agent.max_new_tokens=8", "agent.max_turns=3", "agent.max_tool_calls=1",
        "agent.prefill=tags", "agent.lenient_tags=true", "agent.read_search_results=false"]


@pytest.fixture(scope="module")
def local_suite(tmp_path_factory) -> tuple[Path, Path]:
    """A corpus, its FAISS index (`hexsearch index build`) and a FlashRAG-style QA file about it."""
    root = tmp_path_factory.mktemp("localqa")
    corpus = write_corpus(root)
    index = root / "index"
    out = subprocess.run([*HEX, "index", "build", "--corpus", str(corpus), "--out", str(index)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    docs = [json.loads(line) for line in corpus.read_text().splitlines()][:12]
    qa = root / "qa.jsonl"
    with qa.open("w") as f:
        for i, doc in enumerate(docs):
            f.write(json.dumps({"id": f"q{i}", "question": f"What is {doc['title']}?",
                                "golden_answers": [doc["title"]], "metadata": {"hops": 1 + i % 2}}) + "\n")
    return qa, index


def _eval(tmp_path: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*HEX, "eval", *args, f"run.root={tmp_path}"], capture_output=True, text=True,
                          timeout=timeout, cwd=tmp_path)


def test_local_qa_suite_end_to_end(tmp_path, local_suite):
    qa, index = local_suite
    out = _eval(tmp_path, "--suite", "localqa", "--data", str(qa), "--n", "2", "--k", "1,2", "run.name=a",
                f"tools.index_dir={index}", *TINY)
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "a"
    rows = read_rows(run / "results.jsonl")
    assert sorted((r["id"], r["sample"]) for r in rows) == sorted((f"q{i}", j) for i in range(12) for j in (0, 1))
    assert all(set(r["scores"]) == {"em", "f1", "sub_em", "cover_em", "set_f1"} for r in rows)
    assert all(r["correct"] == (r["scores"]["em"] == 1.0) for r in rows)  # no judge: the first scorer decides
    assert all(r["stop_reason"] and r["trajectory"] for r in rows)
    assert any(r["tool_calls"] for r in rows)  # the prefilled <search> reached the FAISS index
    report = json.loads((run / "report.json").read_text())
    overall = report["overall"]
    assert overall["questions"] == 12 and overall["samples"] == 24
    assert set(overall) >= {"avg@2", "pass@1", "pass@2", "maj@2"} and overall["pass@2"] >= overall["pass@1"]
    assert set(report["groups"]["hops"]) == {"1", "2"}
    assert (run / "report.md").read_text().startswith("# Evaluation: localqa")
    assert (run / "accuracy.png").stat().st_size > 0
    assert out.stdout.strip().splitlines()[-1].startswith("RESULT eval suite=localqa questions=12 avg@2=")
    trajs = [json.loads(x) for x in (run / "trajectories" / "eval.jsonl").read_text().splitlines()]
    assert sorted(t["meta"]["key"] for t in trajs) == sorted(f"{r['id']}/{r['sample']}" for r in rows)
    seeds = {(r["id"], r["sample"]): r["seed"] for r in rows}
    assert len(set(seeds.values())) == 24  # every sample its own seed, stable per (question, sample)

    cmp = subprocess.run([*HEX, "eval", "compare", str(run), str(run)], capture_output=True, text=True, timeout=120)
    assert cmp.returncode == 0 and "B - A +0.000" in cmp.stdout


def test_a_killed_run_resumes_with_every_sample_exactly_once(tmp_path, local_suite):
    qa, index = local_suite
    args = ["--suite", "localqa", "--data", str(qa), "--n", "2", "run.name=k", f"tools.index_dir={index}",
            "eval.concurrency=2", *TINY, "agent.max_new_tokens=48", "agent.max_turns=4", "agent.max_tool_calls=2"]
    proc = subprocess.Popen([*HEX, "eval", *args, f"run.root={tmp_path}"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    results = tmp_path / "k" / "results.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if results.exists() and len(results.read_text().splitlines()) >= 3:
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    before = read_rows(results)
    assert 3 <= len(before) < 24, "the run should be killed part-way"
    with results.open("a") as f:
        f.write('{"id": "q0", "sam')  # a torn line, as a kill in mid-write leaves it
    out = _eval(tmp_path, "--resume", str(tmp_path / "k"))
    assert out.returncode == 0, out.stderr[-3000:]
    rows = read_rows(results)
    keys = [(r["id"], r["sample"]) for r in rows]
    assert len(keys) == len(set(keys)) == 24  # every (question, sample) exactly once: 12 questions, n=2
    assert rows[: len(before)] == before  # finished samples were kept, not redone
    assert json.loads((tmp_path / "k" / "report.json").read_text())["overall"]["samples"] == 24


PAGE = "/article"


async def test_web_suite_against_the_fixture_web(tmp_path, tokenizer, monkeypatch):
    """GAIA-format data, Serper search and page access over HTTP (the fixture web), a scripted model, the GAIA
    scorer and a scripted judge with the GAIA prompt; a second run is served by the run's tool cache."""
    from agent.workflow import make_workflow
    from eval.runner import build_eval_judge, eval_workflow_config
    from hexsearch.config import load_config
    from serving.engines.scripted import ScriptedEngine

    monkeypatch.setenv("SERPER_API_KEY", SERPER_KEY)
    gaia = tmp_path / "gaia.json"
    gaia.write_text(json.dumps([
        {"task_id": "t1", "Question": "In what year was the Veyra Lighthouse completed?", "Final answer": "1847",
         "Level": 1, "file_name": ""},
        {"task_id": "t2", "Question": "Summarise the attached sheet.", "Final answer": "x", "Level": 2,
         "file_name": "sheet.xlsx"}]))
    with FixtureWeb() as web:
        cfg = load_config(None, ["eval.suite=gaia", f"eval.data={gaia}", "tools.search_backend=serper",
                                 f"tools.serper_url={web.url('/serper/search')}", "tools.allow_hosts=[127.0.0.1]",
                                 "agent.read_search_results=false", "agent.judge.model=tiny-random",
                                 "engine.model=tiny-random"])
        from eval.evaluate import load_data

        data = load_data(cfg)
        assert [i.id for i in data.items] == ["t1"] and len(data.skipped) == 1  # the file task is skipped
        for attempt in range(2):
            run = RunDir.create(tmp_path / "runs", f"web{attempt}")
            script = ["<search>Veyra lighthouse completed</search>", f"<access>{web.url(PAGE)}</access>",
                      "It was completed in 1847.</think>", "<answer>1847</answer>"]
            engine = ScriptedEngine(script, tokenizer=tokenizer)
            judge_engine = ScriptedEngine(["Correct"], tokenizer=tokenizer)
            run_cfg = eval_workflow_config(cfg, run)
            workflow = make_workflow(run_cfg)
            judge = build_eval_judge(cfg, judge_engine)
            hits_before = sum(web.hits.values())
            rows = await run_samples(run_cfg, run, data.items, engine=engine, workflow=workflow, judge=judge)
            await workflow.aclose()
            (row,) = rows
            assert row["prediction"] == "1847" and row["scores"]["gaia"] == 1.0
            assert row["judge"]["correct"] is True and row["correct"] is True  # the GAIA judge decides
            assert row["tool_calls"] == 2 and row["item_meta"]["level"] == 1
            report = write_report(run.path, rows, suite="gaia", ks=[1], info={"judge_prompt": judge.describe()["prompt_version"]})
            assert report["groups"]["level"]["1"]["avg@1"] == 1.0
            if attempt == 0:
                assert web.hits["/serper/search"] == 1 and web.hits[PAGE] == 1
                first_cost = sum(web.hits.values()) - hits_before
            else:  # another run folder: its own cache, the same requests again
                assert sum(web.hits.values()) - hits_before == first_cost
        # resuming run 0 re-queries nothing: its samples are done and its tools are cached in the run folder
        hits = sum(web.hits.values())
        run0 = RunDir(tmp_path / "runs" / "web0")
        again = await run_samples(eval_workflow_config(cfg, run0), run0, data.items, engine=engine,
                                  workflow=make_workflow(eval_workflow_config(cfg, run0)), judge=None)
        assert len(again) == 1 and sum(web.hits.values()) == hits
        assert (run0.path / "tools.sqlite").exists()


def test_eval_score_rescores_a_predictions_file(tmp_path):
    preds = tmp_path / "preds.jsonl"
    rows = [{"id": "a", "question": "q", "answer": "1,000", "prediction": "1,000"},
            {"id": "b", "question": "q", "answer": "15", "prediction": "15%"},
            {"id": "c", "question": "q", "answer": "Paris", "prediction": "the Paris"},
            {"id": "d", "question": "q", "answer": ["x", "y"], "prediction": None}]
    preds.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "scored.jsonl"
    res = subprocess.run([*HEX, "eval", "score", "--suite", "gaia", "--predictions", str(preds), "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    scored = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in scored] == ["a", "b", "c", "d"]  # same lines, same order
    assert [r["score"] for r in scored] == [1.0, 1.0, 0.0, 0.0]  # GAIA's rules: no article removal
    assert all(r["prediction"] == o["prediction"] for r, o in zip(scored, rows, strict=True))
    assert res.stdout.strip().endswith("accuracy=0.5000")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "answer": "x", "prediction": "x"}\nnot json\n')
    res = subprocess.run([*HEX, "eval", "score", "--suite", "gaia", "--predictions", str(bad), "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and f"{bad}:2" in res.stderr


def test_report_and_compare_figures():
    def rows(correct: dict[str, list[bool]]) -> list[dict]:
        return [{"id": q, "sample": j, "correct": c, "prediction": "p" if c else f"w{j}", "scores": {"em": float(c)},
                 "stop_reason": "answered", "item_meta": {}} for q, cs in correct.items() for j, c in enumerate(cs)]

    a = rows({"q1": [True, False, False, False], "q2": [False] * 4, "q3": [True] * 4})
    s = summarize(a, [1, 2, 4])
    assert s["avg@4"] == pytest.approx((0.25 + 0 + 1) / 3)
    assert s["pass@1"] == pytest.approx(s["avg@4"])
    assert s["pass@4"] == pytest.approx(2 / 3)
    assert s["pass@2"] == pytest.approx((0.5 + 0 + 1) / 3)  # q1: 1 - C(3,2)/C(4,2) = 0.5
    assert s["maj@4"] == pytest.approx(2 / 3)  # q1: four different answers, the first ("p", correct) wins
    b = rows({"q1": [True] * 4, "q2": [False] * 4, "q3": [False] * 4})
    cmp = compare_runs(a, b)
    assert cmp["gained"] == ["q1"] and cmp["lost"] == ["q3"] and cmp["questions"] == 3
    assert cmp["diff"] == pytest.approx((1 - 0.25 + 0 - 1) / 3) and cmp["ci95"][0] <= cmp["diff"] <= cmp["ci95"][1]


def test_every_shipped_eval_recipe_loads():
    from eval.judges import JUDGE_PROMPTS
    from hexsearch.config import load_config

    recipes = sorted((Path(__file__).resolve().parents[1] / "configs" / "eval").glob("*.yaml"))
    suites = {p.stem: load_config(p) for p in recipes if p.stem != "web"}
    assert set(suites) == {"gaia", "xbench", "browsecomp", "frames", "localqa", "world"}
    for name, cfg in suites.items():
        assert cfg.eval.suite == name and max(cfg.eval.k) <= cfg.eval.n
        assert cfg.eval.judge in ("auto", "none", *JUDGE_PROMPTS.names())
    assert suites["gaia"].tools.search_backend == "serper" and suites["gaia"].eval.n == 4
    assert suites["gaia"].agent.judge.backend == "openai" and suites["localqa"].tools.search_backend == "local"


def test_an_unknown_suite_on_the_command_line_lists_the_registered_ones():
    out = subprocess.run([*HEX, "eval", "--suite", "gsm8k"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "eval.suite" in out.stderr and "browsecomp" in out.stderr
