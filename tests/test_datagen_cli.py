"""`hexsearch datagen` end to end: the embedded SmolLM2 on a small offline world writes a dataset with
its report and ground-truth check, the trainer's loader reads it (and, under `-m slow`, `hexsearch train`
takes a step on it), and bad input is a one-line error."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEX = [sys.executable, "-m", "hexsearch.cli"]
WORLD = ["world.entities=40", "world.max_hops=2"]


def _run(args: list[str], cwd, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([*HEX, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _datagen(tmp_path):
    """Generate a small dataset with the embedded SmolLM2, check it and its report; returns its folder."""
    out = tmp_path / "qa"
    world = f"world.out={tmp_path / 'world'}"
    got = _run(["datagen", "--out", str(out), "--n", "2", world, *WORLD, "datagen.max_items=16",
                "datagen.max_edits=1", "datagen.concurrency=8"], tmp_path)
    assert got.returncode == 0, got.stderr[-3000:]
    last = got.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT datagen attempted=") and " verified=" in last
    report = json.loads((out / "report.json").read_text())
    items = [json.loads(line) for line in (out / "items.jsonl").read_text().splitlines()]
    assert report["items"]["attempted"] == len(items) <= 16
    assert report["items"]["accepted"] >= 2, report["rejections"]
    assert report["info"]["models"]["generator"] == "smollm2-135m-instruct"
    assert report["ground_truth"]["items"] == report["items"]["accepted"]
    assert report["usage"]["total"]["prompt_tokens"] > 0 and report["usage"]["per_accepted"]["calls"] > 0
    rows = [json.loads(line) for line in (out / "qa.jsonl").read_text().splitlines()]
    assert len(rows) == report["dataset"]["kept"] >= 1
    for row in rows:
        assert row["answer"] and row["question"].endswith("?") and row["source"] == "hexsearch-synth"
        assert row["provenance"]["statements"] and row["provenance"]["difficulty"]["attempts"] == 4
    from agent.qa import load_qa

    loaded = load_qa(out / "qa.jsonl")  # what `train.data=` reads
    assert [q.question for q in loaded] == [r["question"] for r in rows] and all(q.answers for q in loaded)
    return out


def test_datagen_embedded_model_writes_training_data(tmp_path):
    _datagen(tmp_path)


@pytest.mark.slow  # the default suite's training runs are in test_train_cli, test_docs_extending, test_fault_tolerance
def test_datagen_embedded_model_then_train_one_step(tmp_path):
    out = _datagen(tmp_path)
    world = f"world.out={tmp_path / 'world'}"
    # the dataset is training data as it stands (dev questions and the search index: the world's)
    train = _run(["train", f"train.data={out / 'qa.jsonl'}", "run.root=" +
                  str(tmp_path), "run.name=t", world, *WORLD, "engine.model=tiny-random", "train.steps=1",
                  "train.batch_size=1", "train.group_size=2", "train.eval_questions=1", "train.eval_every=0",
                  "train.save_every=0", "train.engine_replicas=1", "train.rollout_workers=1",
                  "train.filter_groups=none", "agent.max_new_tokens=8", "agent.max_turns=2",
                  "agent.max_tool_calls=1", "agent.max_context_tokens=1024"], tmp_path)
    assert train.returncode == 0, train.stderr[-3000:]
    assert json.loads((tmp_path / "t" / "results.json").read_text())["steps"] == 1


def test_datagen_needs_an_out_folder(tmp_path):
    got = _run(["datagen", "datagen.num_questions=1"], tmp_path, timeout=120)
    assert got.returncode != 0
    assert "--out DIR" in got.stderr and "Traceback" not in got.stderr


def test_datagen_bad_corpus_row_names_file_and_line(tmp_path):
    corpus = tmp_path / "pages.jsonl"
    corpus.write_text('{"url": "u1", "contents": "Alpha\\nAlpha is a town."}\n{"url": "u2", "contents": 5}\n')
    got = _run(["datagen", "--out", str(tmp_path / "o"), f"datagen.corpus={corpus}"], tmp_path, timeout=120)
    assert got.returncode != 0 and "Traceback" not in got.stderr
    assert f"{corpus}:2" in got.stderr and "'contents' or 'text'" in got.stderr
