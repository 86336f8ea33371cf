"""Per-difficulty figures: the bucket of a question, training's and the dev evaluation's per-bucket
accuracy and tool calls, the PNG of ASearcher's figure, and eval reports broken down by bucket."""

from __future__ import annotations

import json

import pytest

from agent.qa import QAItem, bucket_order, is_bucket_name, question_bucket
from agent.trajectory import ToolCallRecord, Trajectory
from eval.report import build_report
from trainer.batch import bucket_metrics
from trainer.metrics import plot_search_curve


def test_question_bucket():
    assert question_bucket({"family": "lineage", "n": 8, "hops": 8}) == "n8"
    assert question_bucket({"family": "bridge", "n": 2, "hops": 2}) == "hops2"
    assert question_bucket({"hops": 3}) == "hops3"  # rows from before families existed
    assert question_bucket({"family": "lineage", "n": "many"}) is None  # a foreign free-form field
    assert question_bucket({"level": 1}) is None


def test_bucket_names_sort_hops_then_n_each_by_number():
    names = ["n32", "hops10", "n4", "hops2", "overall", "n16", "hops1"]
    assert sorted(names, key=bucket_order) == ["hops1", "hops2", "hops10", "n4", "n16", "n32", "overall"]
    assert [is_bucket_name(b) for b in ("n8", "hops3", "noise", "hops", "n8x")] == [True, True, False, False, False]


def _traj(bucket: str, correct: bool, calls: int) -> Trajectory:
    t = Trajectory("q", "?", gold=["Ada"], prediction="Ada" if correct else "Bob",
                   tool_calls=[ToolCallRecord(turn=i, name="search", args={}) for i in range(calls)])
    t.meta["bucket"] = bucket
    return t


def test_bucket_metrics_mean_accuracy_and_tool_calls_per_bucket():
    trajs = [_traj("n8", True, 8), _traj("n8", False, 3), _traj("hops2", True, 2), Trajectory("x", "?")]
    got = bucket_metrics(trajs, "train/accuracy", "agent/tool_calls")
    assert got == {"train/accuracy/hops2": 1.0, "agent/tool_calls/hops2": 2.0,
                   "train/accuracy/n8": 0.5, "agent/tool_calls/n8": 5.5}


def test_search_curve_png(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "agent/tool_calls/n32": 4.0 + s, "train/accuracy/n32": 0.1 * s,
             "agent/tool_calls/hops2": 2.0, "train/accuracy/hops2": 0.5} for s in range(1, 4)]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = plot_search_curve(metrics, tmp_path / "search_curve.png")
    assert out is not None and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "plain.jsonl").write_text(json.dumps({"step": 1, "train/reward": 0.1}) + "\n")
    assert plot_search_curve(tmp_path / "plain.jsonl", tmp_path / "none.png") is None


def test_eval_report_groups_by_bucket():
    items = [QAItem("a", "?", ["x"], meta={"family": "lineage", "n": 8, "hops": 8}),
             QAItem("b", "?", ["x"], meta={"family": "bridge", "n": 2, "hops": 2})]
    rows = [{"id": i.id, "correct": c, "prediction": "x", "stop_reason": "answered", "item_meta": i.meta,
             "tool_calls": k} for i, c, k in zip(items, (True, False), (8, 2), strict=True)]
    report = build_report(rows, suite="world", ks=[1], info={})
    assert report["groups"]["bucket"]["n8"]["avg@1"] == 1.0
    assert report["groups"]["bucket"]["hops2"]["avg@1"] == 0.0
    assert report["groups"]["bucket"]["n8"]["mean"]["tool_calls"] == 8.0


def test_dev_subset_spreads_over_buckets():
    from trainer.runtime import spread_over_buckets

    items = [QAItem(f"b{i}", "?", ["x"], meta={"hops": 1}) for i in range(6)]
    items += [QAItem(f"l{i}", "?", ["x"], meta={"family": "lineage", "n": 8 * (1 + i % 2)}) for i in range(4)]
    assert [i.id for i in spread_over_buckets(items, 5)] == ["b0", "l0", "l1", "b1", "l2"]
    assert [i.id for i in spread_over_buckets(items[:6], 4)] == ["b0", "b1", "b2", "b3"]  # one bucket: the head
    assert len(spread_over_buckets(items, 100)) == 10
    # weights: items per round per bucket (sft.bucket_weights); 0 leaves a bucket out
    assert [i.id for i in spread_over_buckets(items, 6, {"hops1": 3})] == ["b0", "b1", "b2", "l0", "l1", "b3"]
    assert [i.id for i in spread_over_buckets(items, 10, {"n8": 0, "n16": 0})] == [f"b{i}" for i in range(6)]
    with pytest.raises(ValueError, match=r"no question: \['hops2'\]; the buckets are \['hops1', 'n16', 'n8'\]"):
        spread_over_buckets(items, 4, {"hops2": 2})


def test_training_mix_keeps_each_buckets_share():
    """train.bucket_weights: the RL question stream holds each bucket in proportion to its weight, over as
    many whole rounds as the scarcest weighted bucket fills; 0 leaves a bucket out; no weights: all items."""
    from collections import Counter

    from agent.qa import question_bucket
    from trainer.runtime import mix_buckets

    items = [QAItem(f"b{i}", "?", ["x"], meta={"hops": 1 + i % 2}) for i in range(12)]  # 6 hops1, 6 hops2
    items += [QAItem(f"l{i}", "?", ["x"], meta={"family": "lineage", "n": 8 * (1 + i % 2)}) for i in range(6)]

    def mix(weights):
        return Counter(str(question_bucket(i.meta)) for i in mix_buckets(items, weights))

    assert mix_buckets(items, {}) == items
    assert mix({"hops2": 2}) == {"hops1": 3, "hops2": 6, "n8": 3, "n16": 3}    # hops2 fills 3 rounds of 2
    assert mix({"hops2": 3, "n16": 0}) == {"hops1": 2, "hops2": 6, "n8": 2}    # 2 rounds of 3
    assert mix({"hops1": 6, "hops2": 6}) == {"hops1": 6, "hops2": 6, "n8": 1, "n16": 1}
    with pytest.raises(ValueError, match=r"no question: \['hops3'\]"):
        mix_buckets(items, {"hops3": 1})
