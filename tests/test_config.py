"""Config system: defaults < YAML < overrides, with errors that name the key and list valid ones."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from hexsearch.config import ConfigError, HexConfig, describe, field_docs, load_config, to_yaml


def test_defaults_load_as_dataclasses():
    cfg = load_config()
    assert isinstance(cfg, HexConfig)
    assert cfg.train.max_staleness >= 0 and cfg.agent.max_turns > 0


def test_yaml_then_overrides(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("train:\n  lr: 1.0e-4\n  steps: 7\nagent:\n  max_turns: 3\n")
    child = tmp_path / "child.yaml"
    child.write_text("extends: base.yaml\ntrain:\n  steps: 9\n")
    cfg = load_config(child, ["agent.max_turns=5", "tools.allow_hosts=[127.0.0.1]"])
    assert cfg.train.lr == pytest.approx(1e-4)
    assert cfg.train.steps == 9  # child wins over base
    assert cfg.agent.max_turns == 5  # override wins over YAML
    assert cfg.tools.allow_hosts == ["127.0.0.1"]


def test_one_load_never_changes_the_next(tmp_path):
    """The defaults' schema is built once per process (hexsearch/config.py _schema): a load's overrides, YAML
    and later edits of its result stay out of every other load."""
    (tmp_path / "c.yaml").write_text("agent: {max_turns: 9}\ntools: {builtin: [search]}\n")
    first = load_config(tmp_path / "c.yaml", ["train.lr=7e-5"])
    first.tools.builtin.append("access")
    first.agent.system_prompt = "changed"
    again = load_config(None)
    assert again == HexConfig() and again.tools.builtin == ["search", "access"] and again.agent.max_turns != 9


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["train.lrr=1"])
    msg = str(e.value)
    assert "train.lrr" in msg and "lr" in msg and "batch_size" in msg


def test_unknown_key_in_yaml_names_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("agent:\n  max_turnz: 3\n")
    with pytest.raises(ConfigError, match="bad.yaml.*agent.max_turnz.*max_turns"):
        load_config(bad)


def test_unknown_section_lists_sections():
    with pytest.raises(ConfigError, match="trian.*train"):
        load_config(None, ["trian.lr=1"])


def test_a_mapping_written_without_spaces_gets_the_syntax_that_works():
    """`{hops1:1}` is YAML for the key "hops1:1" with no value: the error says how to write the mapping."""
    with pytest.raises(ConfigError, match=r"'train.bucket_weights.hops1:1'.*a space after each colon"):
        load_config(None, ["train.bucket_weights={hops1:1,hops2:5}"])
    assert load_config(None, ["train.bucket_weights={hops1: 1, hops2: 5}"]).train.bucket_weights == {"hops1": 1, "hops2": 5}


def test_wrong_type_names_key():
    with pytest.raises(ConfigError, match="train.steps"):
        load_config(None, ["train.steps=many"])


def test_override_without_equals_is_rejected():
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["train.steps"])


def test_missing_file_and_extends_loop(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("extends: b.yaml\n")
    b.write_text("extends: a.yaml\n")
    with pytest.raises(ConfigError, match="loop"):
        load_config(a)


def test_every_config_field_has_a_docstring():
    def walk(cls):
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            assert docs.get(f.name), f"{cls.__name__}.{f.name} has no docstring"
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if dataclasses.is_dataclass(default):
                walk(type(default))

    walk(HexConfig)
    keys = [k for k, _, _ in describe()]
    assert "train.max_staleness" in keys and len(keys) == len(set(keys))


def test_shipped_configs_resolve():
    from pathlib import Path

    from trainer.planner.specs import ModelSpec, WorkloadSpec, load_catalog, load_cluster, load_spec

    planner = Path("configs/planner")
    for path in sorted(Path("configs").rglob("*.yaml")):  # recipes in subfolders too (eval/, datagen/)
        if planner not in path.parents:
            to_yaml(load_config(path))
    # the planner's inputs are specs of their own kinds (clusters, models, workloads, the GPU catalog)
    assert load_catalog(planner / "gpus.yaml")
    for path in sorted((planner / "clusters").glob("*.yaml")):
        load_cluster(path)
    for path in sorted((planner / "models").glob("*.yaml")):
        load_spec(path, ModelSpec)
    for path in sorted((planner / "workloads").glob("*.yaml")):
        load_spec(path, WorkloadSpec)


def test_cli_config_show_rejects_misspelt_key():
    proc = subprocess.run([sys.executable, "-m", "hexsearch.cli", "config", "show", "agent.max_trns=3"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "unknown config key 'agent.max_trns'" in proc.stderr and "max_turns" in proc.stderr
    ok = subprocess.run([sys.executable, "-m", "hexsearch.cli", "config", "show", "agent.max_turns=3"],
                        capture_output=True, text=True)
    assert ok.returncode == 0 and "max_turns: 3" in ok.stdout


@pytest.mark.parametrize("override, message", [
    ("agent.max_turns=-5", "agent.max_turns: -5 is out of range: it must be at least 1 and at most 1000"),
    ("train.lr=-1", "train.lr: -1 is out of range: it must be above 0"),
    ("train.batch_size=0", "train.batch_size: 0 is out of range: it must be at least 1"),
    ("tools.retries=-1", "tools.retries: -1 is out of range: it must be at least 0"),
    ("agent.top_p=1.5", "agent.top_p: 1.5 is out of range: it must be above 0 and at most 1"),
    ("train.lr=nan", "train.lr: nan is not a finite number"),
    ("datagen.min_hops=5", "datagen.min_hops=5 is larger than datagen.max_hops=4"),
])
def test_out_of_range_values_are_config_errors(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert str(e.value) == message


@pytest.mark.parametrize("row, message", [(None, "no such QA file"), ('{"question": 5}', ":1: 'question' must be")])
def test_train_bad_dataset_is_one_line_and_makes_no_run_folder(tmp_path, row, message):
    data = tmp_path / "qa.jsonl"
    if row is not None:
        data.write_text(row + "\n")
    proc = subprocess.run([sys.executable, "-m", "hexsearch.cli", "train", f"train.data={data}",
                           f"run.root={tmp_path / 'runs'}"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip()
    assert "\n" not in line and line.startswith(f"hexsearch: train.data: {data}") and message in line
    assert not (tmp_path / "runs").exists()


def test_a_zero_bucket_weight_may_name_a_bucket_this_world_lacks_but_not_a_misspelt_one():
    """A recipe's mix leaves out buckets with 0 (configs/long-horizon.yaml: n2..n16): a smaller world without
    them runs it; any other weight, or a name that is no bucket at all, still names what exists."""
    from agent.qa import QAItem
    from trainer.runtime import spread_over_buckets

    items = [QAItem(id=f"q{i}", question=f"q{i}?", answers=["a"], meta={"hops": 1 + i % 2}) for i in range(4)]
    assert len(spread_over_buckets(items, 4, {"hops1": 1, "n32": 0, "hops3": 0})) == 4
    assert [i.meta["hops"] for i in spread_over_buckets(items, 4, {"hops1": 0, "n32": 0})] == [2, 2]
    for bad in ({"n32": 1}, {"hosp1": 0}):
        with pytest.raises(ValueError, match=r"name buckets with no question: \['(n32|hosp1)'\]"):
            spread_over_buckets(items, 4, bad)


@pytest.mark.parametrize("command, key", [("train", "train.bucket_weights"), ("sft", "sft.bucket_weights")])
def test_bucket_weights_naming_no_bucket_is_one_line_and_makes_no_run_folder(tmp_path, command, key):
    """train.bucket_weights and sft.bucket_weights are checked against the training questions' buckets before
    Ray or a run folder."""
    data = tmp_path / "qa.jsonl"
    data.write_text(json.dumps({"question": "q?", "answer": "a", "hops": 1}) + "\n")
    proc = subprocess.run([sys.executable, "-m", "hexsearch.cli", command, f"train.data={data}",
                           f"train.dev_data={data}", f"{key}={{hops2: 3}}", "engine.model=tiny-random",
                           f"run.root={tmp_path / 'runs'}"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip()
    assert line == (f"hexsearch: {key}: bucket weights name buckets with no question: ['hops2']; "
                    "the buckets are ['hops1']"), line
    assert not (tmp_path / "runs").exists()
