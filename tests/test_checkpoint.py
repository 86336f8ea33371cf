"""Checkpoints: atomic commit, `latest`, pruning, buffered trajectories round-trip, bad files."""

from __future__ import annotations

import pytest

from agent.trajectory import Segment, Trajectory
from trainer import checkpoint
from trainer.buffer import Group, GroupBuffer
from trainer.data import QuestionStream


def _group(key: str, seq: int, versions=(3, 4)) -> Group:
    seg = Segment()
    seg.append_prompt([1, 2, 3])
    seg.append_generated([7, 8], [-0.5, -0.25], list(versions))
    trajs = [Trajectory(question_id=f"q{key}", question="Who?", gold=["x"], segments=[seg], reward=r) for r in (0.0, 1.0)]
    return Group(key=key, question_id=f"q{key}", trajectories=trajs, admitted_version=versions[0], seq=seq)


def _save(root, step: int, groups=(), keep: int = 2):
    tmp = checkpoint.begin(root, step)
    (tmp / "learner").mkdir()  # what the learner ranks write (trainer/learner_state.py)
    (tmp / "learner" / "__0_0.distcp").write_bytes(b"weights")
    (tmp / "learner.json").write_text("{}")
    return checkpoint.commit(tmp, step, {"loop": {"step": step}}, list(groups), keep=keep)


def test_commit_is_atomic_and_latest_points_at_newest(tmp_path):
    assert checkpoint.latest(tmp_path) is None
    _save(tmp_path, 1)
    path = _save(tmp_path, 2, [_group("0:5", 7)])
    assert checkpoint.latest(tmp_path) == path and path.name == "step-2"
    assert not list(tmp_path.glob(".tmp-*"))
    state, groups = checkpoint.load(path)
    assert state["loop"]["step"] == 2
    g = groups[0]
    assert (g.key, g.seq, g.min_version, g.rewards) == ("0:5", 7, 3, [0.0, 1.0])
    assert g.trajectories[0].segments[0].versions == [-1, -1, -1, 3, 4]


def test_half_written_checkpoint_is_ignored(tmp_path):
    good = _save(tmp_path, 1)
    tmp = checkpoint.begin(tmp_path, 2)        # crashed before commit: no state.json, no rename
    (tmp / "learner.json").write_text("{}")
    assert checkpoint.latest(tmp_path) == good
    with pytest.raises(RuntimeError, match="learner.json"):
        checkpoint.commit(checkpoint.begin(tmp_path, 3), 3, {}, [])


def test_prune_keeps_the_newest(tmp_path):
    for step in range(1, 6):
        _save(tmp_path, step, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-4", "step-5"]
    again = _save(tmp_path, 5, keep=2)                  # re-saving a step after a resume replaces it
    assert again.name == "step-5" and (again / "state.json").exists()


def test_bad_buffer_line_names_file_and_line(tmp_path):
    path = _save(tmp_path, 1, [_group("0:1", 0)])
    with (path / "buffer.jsonl").open("a") as f:
        f.write('{"key": "0:2"}\n')
    with pytest.raises(ValueError, match=r"buffer.jsonl:2"):
        checkpoint.load(path)


async def test_buffer_restores_in_acceptance_order():
    buf = GroupBuffer()
    buf.restore([_group("0:3", 5), _group("0:1", 2)])
    buf.put(_group("0:9", -1))                          # new groups continue after the restored ones
    got = [(await buf.get()).key for _ in range(3)]
    assert got == ["0:1", "0:3", "0:9"]


def test_stream_resume_neither_repeats_nor_skips():
    items = list(range(10))
    a = QuestionStream(items, seed=3)
    taken = [a.next()[0] for _ in range(4)]
    state = a.state_dict(in_flight=[taken[1], taken[3]])   # two were in flight when the process died
    b = QuestionStream(items, seed=3)
    b.load_state_dict(state)
    rest = [b.next()[0] for _ in range(8)]
    assert rest[:2] == [taken[1], taken[3]]                # re-run first
    completed = [taken[0], taken[2], *rest]
    assert len(set(completed)) == len(completed)
    keys_epoch0 = {k for k in completed if k.startswith("0:")}
    assert keys_epoch0 == {f"0:{i}" for i in range(10)}    # the whole epoch, each key once
    assert [a.item(f"0:{i}") for i in range(10)] != items  # seeded shuffle
    assert sorted(a.item(f"0:{i}") for i in range(10)) == items


def test_damaged_latest_falls_back_to_the_previous_valid_one(tmp_path, caplog):
    first = _save(tmp_path, 1)
    second = _save(tmp_path, 2)
    assert (second / "manifest.json").exists() and checkpoint.verify(second) is None
    with (second / "learner" / "__0_0.distcp").open("r+b") as f:  # a shard truncated after the commit
        f.truncate(3)
    with caplog.at_level("WARNING"):
        assert checkpoint.latest(tmp_path) == first
    assert "learner/__0_0.distcp has 3 bytes" in caplog.text and "trying an older one" in caplog.text
    state = (first / "state.json").read_text()
    (first / "state.json").write_text(state.replace("1", "7"))  # same size, other content
    assert "state.json does not match its SHA-256" in checkpoint.verify(first)
    assert checkpoint.latest(tmp_path) is None


def test_nothing_in_the_project_unpickles():
    """Resuming reads JSON and `torch.load(weights_only=True)` only: a pickle dropped into a run folder is
    never loaded (the learner's state round-trips under weights_only in tests/test_learner.py)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    offenders = []
    for package in ("agent", "core", "world", "datagen", "eval", "hexsearch", "serving", "tools", "trainer", "benchmarks"):
        for path in (root / package).rglob("*.py"):
            text = path.read_text()
            if re.search(r"^\s*import pickle|pickle\.loads?\(|cloudpickle\.loads?\(", text, re.MULTILINE):
                offenders.append(f"{path.relative_to(root)}: pickle")
            for call in re.findall(r"torch\.load\(.*", text):  # the call's line
                if "weights_only=True" not in call:
                    offenders.append(f"{path.relative_to(root)}: {call}")
    assert offenders == []


def test_only_step_folders_inside_the_checkpoints_folder_count(tmp_path, caplog):
    """`step-x`, `step-3.bak`, a `step-9` symlink out of the folder, and a `latest` naming a checkpoint outside
    (valid as it is) are all ignored, without an exception: the newest real checkpoint is used."""
    import json

    root, outside = tmp_path / "checkpoints", tmp_path / "elsewhere"
    _save(root, 1)
    good = _save(root, 2)
    foreign = _save(outside, 7)
    for name in ("step-x", "step-3.bak", "step-", "step-1e3"):
        (root / name).mkdir()
    (root / "step-9").symlink_to(foreign, target_is_directory=True)
    assert checkpoint.latest(root) == good
    for pointer in ("../elsewhere/step-7", str(foreign), "step-9", "step-2/../../elsewhere/step-7", "step-x"):
        (root / "latest").write_text(pointer)
        assert checkpoint.latest(root) == good, pointer
    assert "not a step-<n> folder" in caplog.text
    _save(root, 3, keep=2)  # pruning skips what is not a step folder, and never follows the link
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step-3")) == ["step-3", "step-3.bak"]
    assert (foreign / "state.json").exists() and json.loads((foreign / "state.json").read_text())


@pytest.mark.parametrize("manifest", [None, "{not json", "[1, 2]", "{}", '{"state.json": "x"}',
                                      '{"../step-1/state.json": {"size": 1, "sha256": "a"}}',
                                      '{"/etc/hostname": {"size": 1, "sha256": "a"}}',
                                      '{"state.json": {"size": "big", "sha256": 1}}'])
def test_a_missing_or_malformed_manifest_invalidates_that_checkpoint_only(tmp_path, manifest):
    first = _save(tmp_path, 1)
    second = _save(tmp_path, 2)
    if manifest is None:
        (second / "manifest.json").unlink()
    else:
        (second / "manifest.json").write_text(manifest)
    assert checkpoint.verify(second) is not None
    assert checkpoint.latest(tmp_path) == first
