"""Run folders for the viewer tests, written the way train, eval, datagen and ask write them.

Trajectories are real `agent.trajectory.Trajectory` objects with the tiny-random model's tokenizer
(the SmolLM2 tokenizer), so the token view decodes them; one line of the train file is not JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

from agent.trajectory import Segment, ToolCallRecord, Trajectory
from core.rundir import RunDir

PROMPT = "<|im_start|>user\nQuestion: {q}<|im_end|>\n<|im_start|>assistant\n"
BAD_LINE = '{"question_id": "broken", "question": '


def make_trajectory(tokenizer, q: str, answer: str, reward: float, *, group: str, step: int, version: int,
                    qid: str, key: str | None = None, stop: str = "answered", rewrite: bool = False) -> Trajectory:
    """Two turns (a search, then an answer); with `rewrite` the second turn starts a new segment."""
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    first, seg = Segment(), None
    first.append_prompt(enc(PROMPT.format(q=q)))
    act = enc(f"<think>look it up</think><search>{q[:30]}</search>")
    first.append_generated(act, [-0.5 - 0.1 * i for i in range(len(act))], [version] * len(act))
    obs = enc("\n<information>[1] Varnholt was founded in 1642.</information>\n")
    answer_ids = enc(f"<answer>{answer}</answer>")
    if rewrite:
        seg = Segment()
        seg.append_prompt(enc(PROMPT.format(q=q) + "[page read: notes kept]\n"))
        seg.append_generated(answer_ids, [-0.05] * len(answer_ids), [version + 1] * len(answer_ids))
    else:
        first.append_prompt(obs)
        first.append_generated(answer_ids, [-0.05] * len(answer_ids), [version + 1] * len(answer_ids))
    segments = [first] + ([seg] if seg else [])
    turns = [{"turn": 0, "kind": "act", "prompt_tokens": 20, "new_tokens": len(act), "finish": "stop",
              "segment": 0, "llm_s": 0.4},
             {"turn": 1, "kind": "act", "prompt_tokens": 40, "new_tokens": len(answer_ids), "finish": "stop",
              "segment": len(segments) - 1, "llm_s": 0.3}]
    return Trajectory(
        question_id=qid, question=q, gold=["1642"], segments=segments,
        tool_calls=[ToolCallRecord(0, "search", {"query": q[:30]}, latency_s=0.012, summary="[1] Varnholt ... 1642"),
                    *([ToolCallRecord(0, "access", {"url": "https://hexwiki.test/x"}, error="timeout after 5 s")]
                      if stop != "answered" else [])],
        prediction=answer if stop == "answered" else None, stop_reason=stop, num_turns=2, reward=reward,
        reward_info={"metric": "f1", "f1": reward, "em": float(reward == 1.0), "score": reward, "format_ok": True},
        timings={"total": 0.8, "llm": 0.7, "tools": 0.012}, group_id=group,
        meta={"turns": turns, "step": step, "key": key or group.split("#")[0], "generated_tokens": len(act) + len(answer_ids)})


def make_train_run(root: Path, tokenizer, *, groups: int = 6, bad_line: bool = True) -> Path:
    run = RunDir.create(root, "train-demo", kind="train")
    run.config.write_text("engine:\n  model: tiny-random\ntrain:\n  advantage: grpo\n")
    with run.metrics.open("w") as f:
        f.write(json.dumps({"step": 0, "eval/reward": 0.3, "eval/accuracy": 0.3}) + "\n")
        for step in range(1, 6):
            f.write(json.dumps({"step": step, "train/reward": 0.3 + 0.1 * step, "train/accuracy": 0.25 + 0.1 * step,
                                "train/kept_groups": 3 + step % 2, "train/tokens_per_s": 200 + step,
                                "rollout/gen_tokens_per_s": 20.0 + step, "rollout/queue_depth": 8.0,
                                "rollout/running": 2.0, "rollout/accepted": 8.0 * step, "rollout/staleness_mean": 0.5,
                                "rollout/staleness_max": 1, "rollout/staleness_hist": {"0": 16, "1": 16},
                                "tools/search/calls": 40.0 * step, "tools/search/ok": 40.0 * step,
                                "tools/search/errors": 0.0, "tools/search/latency_p50_s": 0.01}) + "\n")
        f.write(json.dumps({"step": 5, "eval/reward": 0.7, "eval/accuracy": 0.65}) + "\n")
    run.write_json(run.results, {"dev_reward_before": 0.3, "dev_reward_after": 0.7, "steps": 5, "minutes": 1.5})
    lines = []
    for g in range(groups):
        rewards = [1.0, 0.0, 1.0, 0.0] if g % 2 == 0 else [1.0, 1.0, 1.0, 1.0]
        for i, r in enumerate(rewards):
            stop = "answered" if not (g == 1 and i == 3) else "max_turns"
            lines.append(make_trajectory(tokenizer, f"In what year was city number {g} founded?",
                                         "1642" if r else "1700", r, group=f"0:{g}#0", step=1 + g // 2, version=g // 2,
                                         qid=f"hw-train-{g:03d}", stop=stop, rewrite=(g == 0 and i == 0)).to_json())
    if bad_line:
        lines.insert(3, BAD_LINE)
    (run.trajectories / "train.jsonl").write_text("\n".join(lines) + "\n")
    return run.path


def make_eval_run(root: Path, tokenizer) -> Path:
    run = RunDir.create(root, "eval-demo", kind="eval")
    run.config.write_text("engine:\n  model: tiny-random\neval:\n  suite: local\n")
    rows, trajs = [], []
    for k in range(8):
        correct = k % 3 != 0
        t = make_trajectory(tokenizer, f"Who founded town {k}?", "Dalia" if correct else "Tom", float(correct),
                            group="eval", step=0, version=0, qid=f"q{k}", key=f"q{k}/0")
        trajs.append(t.to_json())
        rows.append({"id": f"q{k}", "sample": 0, "question": t.question, "gold": ["Dalia"], "prediction": t.prediction,
                     "scores": {"em": float(correct)}, "correct": correct, "stop_reason": "answered",
                     "turns": 2, "tool_calls": 1, "seconds": 0.8, "item_meta": {"level": 1 + k % 2},
                     "trajectory": f"trajectories/eval.jsonl#q{k}/0"})
    (run.path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run.trajectories / "eval.jsonl").write_text("\n".join(trajs) + "\n")
    run.write_json(run.path / "report.json", {"suite": "local", "overall": {"questions": 8, "accuracy": 5 / 8}})
    (run.path / "report.md").write_text("# local\n\naccuracy 0.625 <script>alert(1)</script>\n")
    return run.path


def make_datagen_run(root: Path) -> Path:
    out = root / "qa-demo"
    out.mkdir(parents=True)
    items = []
    for i in range(6):
        ok = i % 2 == 0
        items.append({"id": f"dg-{i:06d}", "index": i, "status": "accepted" if ok else "rejected",
                      "reason": "" if ok else ("fuzz: difficulty: solved 4/4" if i != 5 else "base: guard: answer in question"),
                      "question": f"Which city, founded by the glassblower's teacher, is number {i}?", "answer": "Varnholt",
                      "hops": 2, "pages": ["https://hexwiki.test/a"], "statements": [{"text": "s", "url": "u", "title": "t"}],
                      "edits": [{"action": "base", "accepted": ok, "question": "q", "answer": "a", "note": "",
                                 "pages": [], "checks": [{"name": "guard", "passed": ok, "reason": "" if ok else "x",
                                                          "detail": {}}]}],
                      "difficulty": {"correct": 1, "attempts": 4, "predictions": []}, "seconds": 3.0})
    (out / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items))
    (out / "report.json").write_text(json.dumps({"attempted": 6, "accepted": 3, "acceptance": 0.5}))
    return out


def make_ask_run(root: Path, tokenizer) -> Path:
    run = RunDir.create(root, "ask-demo", kind="ask")
    run.config.write_text("engine:\n  model: tiny-random\n")
    t = make_trajectory(tokenizer, "In what year was Varnholt founded?", "1642", 1.0, group="", step=0, version=0, qid="ask")
    (run.trajectories / "ask.jsonl").write_text(t.to_json() + "\n")
    run.write_json(run.results, {"question": t.question, "prediction": "1642", "stop_reason": "answered", "turns": 2})
    return run.path


def make_all(root: Path, tokenizer) -> list[Path]:
    return [make_train_run(root, tokenizer), make_eval_run(root, tokenizer), make_datagen_run(root),
            make_ask_run(root, tokenizer)]
