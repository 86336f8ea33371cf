"""`hexsearch check-logprobs` (trainer/logprob_check.py): every policy token is re-scored by the weights of the
version that sampled it (version 0: the run's engine.model; version v: the checkpoint whose state says v), and a
token whose recorded log-prob came from other weights fails the check. The end-to-end check on a real run's
sampled trajectories is in tests/test_train_cli.py and tests/test_demo_long.py."""

from __future__ import annotations

import torch
from test_export import _trained_run

from agent.trajectory import Segment, Trajectory
from serving.models import load_model
from trainer.config import TrainConfig
from trainer.logprob_check import check_run

PROMPT = [1, 9690, 198, 21350, 2029, 314, 253, 1789]
GENERATED = [2683, 314, 3467, 28, 1097, 30, 2]


def _logp(model, ids: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return [0.0] + torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def _episode(qid: str, model, version: int) -> Trajectory:
    """An episode whose generated tokens carry `model`'s log-probs, tagged as sampled at `version`."""
    seg = Segment()
    seg.append_prompt(PROMPT)
    logp = _logp(model, PROMPT + GENERATED)[len(PROMPT):]
    seg.append_generated(GENERATED, logp, [version] * len(GENERATED))
    return Trajectory(question_id=qid, question="?", segments=[seg], num_turns=1)


def test_each_version_is_scored_by_its_own_weights(tmp_path):
    run, learner = _trained_run(tmp_path, "r", TrainConfig(precision="fp32"),
                                state={"loop": {"step": 3, "version": 3}})
    (run / "config.yaml").write_text("engine:\n  model: tiny-random\n  dtype: float32\ntrain:\n  lora_rank: 0\n")
    base = load_model("tiny-random", dtype="float32")
    trained = learner.model.eval()
    right = [_episode("v0", base, 0), _episode("v3", trained, 3)]
    wrong = _episode("v3-scored-by-v0", base, 3)       # the log-probs of weights other than its version's
    gone = _episode("v5", trained, 5)                  # a version the run kept no checkpoint of
    path = tmp_path / "trajs.jsonl"
    path.write_text("".join(t.to_json() + "\n" for t in [*right, wrong, gone]))

    report = check_run(run, trajectories=path, limit=0)
    by_id = {e.question_id: e for e in report.episodes}
    assert report.versions == [0, 3] and report.dtype == "float32"
    assert by_id["v0"].checked == by_id["v3"].checked == len(GENERATED)
    assert by_id["v0"].max_diff < 1e-4 and by_id["v3"].max_diff < 1e-4
    assert by_id["v3-scored-by-v0"].mean_diff > 10 * report.tolerance
    assert by_id["v5"].checked == 0 and by_id["v5"].unchecked == len(GENERATED)
    assert not report.ok

    (tmp_path / "right.jsonl").write_text("".join(t.to_json() + "\n" for t in [*right, gone]))
    report = check_run(run, trajectories=tmp_path / "right.jsonl", limit=0, complete=True)
    assert report.ok and {e.question_id for e in report.episodes} == {"v0", "v3"}
