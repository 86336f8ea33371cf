"""The shipped ASearcher recipes mean what ASearcher's configs mean.

Each configs/asearcher-*.yaml cites, in its own header, the ASearcher config it follows and that config's values
(a `#   asearcher: key=value ...` line). The test reads that line from the file itself, so a value changed in the
recipe without its citation (or a citation copied from another recipe without the values) fails. ASearcher's
`max_concurrent_rollouts` counts groups of `n_trajs`; ours counts trajectories, so the cap must be their product,
and the trajectories the run can really have in flight (cap, staleness bound, rollout worker slots) with it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hexsearch.config import RENAMED, load_config
from trainer.staleness import concurrency_warnings, inflight_trajectories

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
RECIPES = sorted(CONFIGS.glob("asearcher-*.yaml"))
CITATION = "#   asearcher:"


def cited(path: Path) -> dict[str, str]:
    """The `key=value` pairs of the recipe's own citation line (not one inherited through `extends`)."""
    lines = [line for line in path.read_text().splitlines() if line.startswith(CITATION)]
    assert len(lines) == 1, f"{path.name}: needs exactly one '{CITATION} key=value ...' header line, has {len(lines)}"
    pairs = dict(item.split("=", 1) for item in lines[0][len(CITATION):].split())
    missing = {"config", "max_concurrent_rollouts", "n_trajs", "batch_size", "max_head_offpolicyness", "max_turns",
               "lr"} - set(pairs)
    assert not missing, f"{path.name}: the citation lacks {sorted(missing)}"
    return pairs


def test_there_are_recipes():
    assert len(RECIPES) >= 4, RECIPES


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_matches_the_asearcher_values_it_cites(path):
    src = cited(path)
    cfg = load_config(path)
    t = cfg.train
    groups, n_trajs = int(src["max_concurrent_rollouts"]), int(src["n_trajs"])
    assert t.group_size == n_trajs
    assert t.batch_size == int(src["batch_size"])
    assert t.max_staleness == int(src["max_head_offpolicyness"])
    assert cfg.agent.max_turns == int(src["max_turns"])
    assert t.lr == pytest.approx(float(src["lr"]))
    assert t.max_inflight_trajectories == groups * n_trajs, "the cap counts trajectories: groups x n_trajs"
    assert inflight_trajectories(t) == groups * n_trajs, "staleness bound or rollout worker slots cap it lower"
    assert src["config"] in path.read_text().split(CITATION)[0], "the header names the cited config above the line"


def test_a_groups_count_copied_as_is_is_caught(tmp_path, caplog):
    """The mistake the rename exists for: ASearcher's 24 (groups) written as our cap admits 1 group of 16."""
    local = CONFIGS / "asearcher-local-7b-1node.yaml"
    with caplog.at_level(logging.WARNING, logger="hexsearch.config"):
        cfg = load_config(local, ["train.max_inflight_trajectories=24"])
    assert inflight_trajectories(cfg.train) == 16
    assert "admits fewer than one step's batch_size x group_size = 2048 (1 of 128 groups at once)" in caplog.text
    assert "is below what the engines can batch" in caplog.text


def test_old_key_still_loads_as_trajectories(tmp_path, caplog):
    assert RENAMED["train.max_concurrent_episodes"] == "train.max_inflight_trajectories"
    path = tmp_path / "old.yaml"
    path.write_text("train:\n  max_concurrent_episodes: 40\n")
    with caplog.at_level(logging.WARNING, logger="hexsearch.config"):
        assert load_config(path).train.max_inflight_trajectories == 40
    assert "'train.max_concurrent_episodes' was renamed 'train.max_inflight_trajectories'" in caplog.text


def test_warnings_name_each_limit():
    cfg = load_config(None, ["train.batch_size=8", "train.group_size=4", "train.max_staleness=1",
                             "train.max_inflight_trajectories=64", "train.rollout_workers=2",
                             "train.worker_concurrency=16", "train.engine_replicas=2", "engine.max_batch_size=48"])
    assert concurrency_warnings(cfg.train, cfg.engine.max_batch_size) == [
        "train.rollout_workers x train.worker_concurrency = 32 caps the trajectories in flight below "
        "train.max_inflight_trajectories=64"]
    assert inflight_trajectories(cfg.train) == 32
    quick = load_config(CONFIGS / "quickstart.yaml")
    assert concurrency_warnings(quick.train, quick.engine.max_batch_size) == []
