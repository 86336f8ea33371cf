"""Run folders: runs started in the same second never share a folder; an explicit name is reused."""

from __future__ import annotations

import threading

from core.rundir import RunDir


def test_runs_started_together_get_their_own_folders(tmp_path):
    made: list[RunDir] = []
    start = threading.Barrier(8)

    def create():
        start.wait()
        made.append(RunDir.create(tmp_path / "runs", kind="ask"))

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    paths = {r.path for r in made}
    assert len(paths) == 8  # eight distinct folders, each with the whole layout
    assert all(p.name.startswith("ask-") and (p / "trajectories").is_dir() and (p / "tb").is_dir() for p in paths)


def test_an_explicit_name_is_reused(tmp_path):
    first = RunDir.create(tmp_path, "t")
    (first.path / "results.json").write_text("{}")
    again = RunDir.create(tmp_path, "t")  # a resumed run writes into the folder it names
    assert again.path == first.path and (again.path / "results.json").exists()
