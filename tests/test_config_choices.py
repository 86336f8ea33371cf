"""Fixed-choice config fields are typed Literals: bad values fail at load with the key and every valid value."""

from __future__ import annotations

import dataclasses
import logging
from typing import Literal

import pytest
import yaml

from core.choices import check_choices, field_types, item_literal_values, literal_values
from hexsearch.config import RENAMED, ConfigError, HexConfig, load_config


def literal_keys(cls: type = HexConfig, prefix: str = "") -> dict[str, tuple[tuple, bool]]:
    """Dotted key -> (valid values, is a list of them) of every Literal and list-of-Literal field, found by
    walking the config dataclasses."""
    out: dict[str, tuple[tuple, bool]] = {}
    types = field_types(cls)
    for f in dataclasses.fields(cls):
        values, items = literal_values(types[f.name]), item_literal_values(types[f.name])
        if values is not None:
            out[prefix + f.name] = (values, False)
        elif items is not None:
            out[prefix + f.name] = (items, True)
        elif dataclasses.is_dataclass(types[f.name]):
            out.update(literal_keys(types[f.name], f"{prefix}{f.name}."))
    return out


CHOICES = {k: v for k, (v, _) in literal_keys().items()}
IS_LIST = {k for k, (_, is_list) in literal_keys().items() if is_list}
KNOWN = {"agent.action_format", "agent.prefill", "agent.prompt_layout",
         "tools.search_backend", "tools.retrieval_worker", "engine.dtype",
         "train.advantage", "train.filter_groups", "train.prox_logp", "train.packing", "train.lr_schedule",
         "run.log_level"}


def test_discovered_literal_fields_include_the_known_ones():
    assert KNOWN <= set(CHOICES), KNOWN - set(CHOICES)
    for key, values in CHOICES.items():
        assert len(values) >= 2 and all(isinstance(v, str) for v in values), key
    # free-form fields that also take an import path stay plain strings
    for key in ("agent.context_policy", "agent.reward_fn", "train.workflow", "engine.device", "engine.model",
                "engine.backend", "agent.judge.backend",
                "tools.builtin", "eval.suite", "eval.scorers", "eval.judge", "datagen.actions"):
        assert key not in CHOICES


def test_defaults_are_valid_choices():
    cfg = load_config()
    check_choices(cfg)
    for key, values in CHOICES.items():
        node = cfg
        for part in key.split("."):
            node = getattr(node, part)
        assert all(v in values for v in node) if key in IS_LIST else node in values, key


def _assert_names_key_and_values(err: ConfigError, key: str, values: tuple) -> None:
    msg = str(err)
    key = f"{key}[0]" if key in IS_LIST else key
    assert f"'{key}'" in msg and "'dorp'" in msg, msg
    assert all(v in msg for v in values), msg
    assert ", ".join(values) in msg, msg


@pytest.mark.parametrize("key", sorted(CHOICES))
def test_bad_choice_override_is_rejected(key):
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"{key}={_value(key, 'dorp')}"])
    assert str(e.value).startswith("command line: ")
    _assert_names_key_and_values(e.value, key, CHOICES[key])


def _value(key: str, value: str) -> str:
    return f"[{value}]" if key in IS_LIST else value


def _yaml(key: str, value: str) -> str:
    *sections, last = key.split(".")
    lines = [f"{'  ' * i}{s}:" for i, s in enumerate(sections)]
    return "\n".join([*lines, f"{'  ' * len(sections)}{last}: {value}"]) + "\n"


@pytest.mark.parametrize("key", sorted(CHOICES))
def test_bad_choice_in_yaml_is_rejected(key, tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text(_yaml(key, _value(key, "dorp")))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value).startswith(f"{path.resolve()}: ")
    _assert_names_key_and_values(e.value, key, CHOICES[key])


@pytest.mark.parametrize("key", sorted(CHOICES))
def test_every_valid_choice_loads(key, tmp_path):
    for i, value in enumerate(CHOICES[key]):
        path = tmp_path / f"{i}.yaml"
        path.write_text(_yaml(key, _value(key, value)))
        via_yaml, via_override = load_config(path), load_config(None, [f"{key}={_value(key, value)}"])
        for cfg in (via_yaml, via_override):
            node = cfg
            for part in key.split("."):
                node = getattr(node, part)
            assert node == ([value] if key in IS_LIST else value)


def test_error_message_format():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["train.filter_groups=dorp"])
    assert str(e.value) == "command line: bad value for 'train.filter_groups': 'dorp' is not one of: drop, reject, none"


Mode = Literal["fast", "slow"]


@dataclasses.dataclass
class Inner:
    mode: Mode = "fast"
    name: str = "free text is not checked"


@dataclasses.dataclass
class Outer:
    kind: Literal["a", "b", "c"] = "a"
    modes: list[Mode] = dataclasses.field(default_factory=list)
    inner: Inner = dataclasses.field(default_factory=Inner)
    items: list[Inner] = dataclasses.field(default_factory=list)
    by_name: dict[str, Inner] = dataclasses.field(default_factory=dict)


def test_check_choices_on_dataclasses_built_in_code():
    check_choices(Outer(items=[Inner(), Inner(mode="slow")], by_name={"x": Inner()}, modes=["fast"]), "top")
    cases = [(Outer(kind="d"), "top.kind: invalid value 'd'; valid: a, b, c"),
             (Outer(inner=Inner(mode="warp")), "top.inner.mode: invalid value 'warp'; valid: fast, slow"),
             (Outer(items=[Inner(), Inner(mode="x")]), "top.items[1].mode: invalid value 'x'; valid: fast, slow"),
             (Outer(by_name={"k": Inner(mode="x")}), "top.by_name.k.mode: invalid value 'x'; valid: fast, slow"),
             (Outer(modes=["slow", "warp"]), "top.modes[1]: invalid value 'warp'; valid: fast, slow")]
    for obj, message in cases:
        with pytest.raises(ValueError) as e:
            check_choices(obj, "top")
        assert str(e.value) == message
    with pytest.raises(ValueError, match=r"^kind: invalid value"):
        check_choices(Outer(kind="z"))


def test_components_check_their_configs_built_in_code():
    from agent.config import AgentConfig
    from serving.config import EngineConfig
    from serving.factory import build_engine
    from tools.config import ToolsConfig
    from tools.factory import ToolConfigError, build_tools

    with pytest.raises(ValueError, match=r"engine.backend: unknown engine backend 'tgi'. Valid: embedded, http, vllm, sglang"):
        build_engine(EngineConfig(backend="tgi"))
    with pytest.raises(ToolConfigError, match=r"tools.retrieval_worker: invalid value 'gpu'; valid: thread, process"):
        build_tools(ToolsConfig(retrieval_worker="gpu", cache_enabled=False))
    with pytest.raises(ToolConfigError, match=r"tools.builtin: unknown built-in tool 'browse'. Valid: search, access"):
        build_tools(ToolsConfig(builtin=["search", "browse"], cache_enabled=False))
    from agent.judge import build_judge

    with pytest.raises(ValueError, match=r"agent.judge.backend: unknown engine backend 'x'. Valid: openai, embedded"):
        build_judge(dataclasses.replace(AgentConfig().judge, backend="x"))
    from agent.loop import Agent

    with pytest.raises(ValueError, match=r"agent.prefill: invalid value 'tag'; valid: none, tags, answer, think"):
        Agent(None, {}, AgentConfig(prefill="tag"))  # checked before the engine is touched


def test_literal_fields_inside_lists_of_dataclasses_are_checked_at_load():
    from hexsearch.config import _bad_choice

    layer = {"tools": {"mcp_servers": [{"name": "a"}]}, "train": {"packing": "${oc.env:PACKING}"}}
    assert _bad_choice(layer, HexConfig) is None  # interpolations are resolved (and checked) later
    assert _bad_choice({"run": {"log_level": "info"}}, HexConfig) == (
        "run.log_level", "info", ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))
    assert _bad_choice({"items": [{"mode": "fast"}, {"mode": "x"}]}, Outer) == ("items[1].mode", "x", ("fast", "slow"))


OLD_VALUES = {"agent.reward": "em", "agent.judge_cache": "/tmp/judge.sqlite", "train.max_concurrent_rollouts": 7,
              "train.max_concurrent_episodes": 9, "train.tool_latency_median_s": 0.25, "train.tool_latency_p99_s": 2.5}


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_renamed_key_in_yaml_and_override(old, tmp_path, caplog):
    new, value = RENAMED[old], OLD_VALUES[old]

    def get(cfg):
        node = cfg
        for part in new.split("."):
            node = getattr(node, part)
        return node

    path = tmp_path / "old.yaml"
    path.write_text(_yaml(old, str(value)))
    with caplog.at_level(logging.WARNING, logger="hexsearch.config"):
        assert get(load_config(path)) == value
    assert str(path.resolve()) in caplog.text and f"'{old}'" in caplog.text and f"'{new}'" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hexsearch.config"):
        assert get(load_config(None, [f"{old}={value}"])) == value
    assert "command line" in caplog.text and f"'{old}'" in caplog.text


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_old_and_new_key_in_one_layer_is_an_error(old, tmp_path):
    new, value = RENAMED[old], OLD_VALUES[old]
    with pytest.raises(ConfigError, match=f"both '{old}' and its new name '{new}'"):
        load_config(None, [f"{old}={value}", f"{new}={value}"])
    both: dict = {}
    for key in (old, new):
        *sections, last = key.split(".")
        node = both
        for section in sections:
            node = node.setdefault(section, {})
        node[last] = value
    path = tmp_path / "both.yaml"
    path.write_text(yaml.safe_dump(both))
    with pytest.raises(ConfigError, match=f"both.yaml: both '{old}'"):
        load_config(path)


def test_old_key_in_base_and_new_key_in_child_file(tmp_path):
    (tmp_path / "base.yaml").write_text("train:\n  max_concurrent_rollouts: 5\n")
    (tmp_path / "child.yaml").write_text("extends: base.yaml\ntrain:\n  max_inflight_trajectories: 9\n")
    assert load_config(tmp_path / "child.yaml").train.max_inflight_trajectories == 9
