"""Numeric ranges declared on the config fields (core/ranges.py): every range the old string-keyed table
(hexsearch/limits.py) held still refuses out-of-range values, from YAML and from `key=value` overrides."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from core.choices import field_types
from core.ranges import Range, check_ranges, field_range, numeric_fields, range_problem, ranged
from hexsearch.config import ConfigError, HexConfig, load_config

_POSITIVE_INTS = """
engine.max_batch_size engine.max_model_len engine.prefill_chunk_tokens engine.tensor_parallel_size
tools.topk tools.max_concurrency tools.max_page_bytes tools.page_chunk_chars tools.max_page_chunks
tools.retrieval_max_batch tools.snippet_chars
agent.max_turns agent.max_new_tokens agent.max_context_tokens agent.max_calls_per_turn agent.page_chunk_chars
agent.max_page_chunks agent.max_obs_chars agent.judge.max_new_tokens
world.min_hops
train.batch_size train.group_size train.max_inflight_trajectories train.rollout_workers train.worker_concurrency
train.engine_replicas train.learner_workers train.minibatches train.micro_batch_tokens train.keep_checkpoints
train.max_question_attempts train.max_consecutive_failures
sft.batch_size sft.rft_samples sft.concurrency
eval.n eval.concurrency
datagen.num_questions datagen.concurrency datagen.max_page_chars datagen.max_info_points datagen.min_hops
datagen.target_hops datagen.max_hops datagen.solver_attempts datagen.search_attempts
datagen.generator.max_new_tokens datagen.solver.max_new_tokens datagen.judge.max_new_tokens
""".split()
_POSITIVE_FLOATS = """
engine.request_timeout_s tools.timeout_s agent.wall_clock_s agent.judge.timeout_s train.lr train.weight_sync_timeout_s
train.engine_health_timeout_s train.learner_step_timeout_s sft.lr sft.epochs
datagen.generator.timeout_s datagen.solver.timeout_s datagen.judge.timeout_s
""".split()
OLD_RANGES: dict[str, tuple[float, float | None, bool]] = {
    **{k: (1, None, True) for k in _POSITIVE_INTS},
    **{k: (0, None, False) for k in _POSITIVE_FLOATS},
    "agent.max_turns": (1, 1000, True), "agent.max_repeated_calls": (0, 1000, True), "agent.top_p": (0, 1, False),
    "agent.compact_to": (0, 0.95, True), "agent.valid_inst_ratio": (0, 1, True), "agent.aug_answer_weight": (0, 1, True),
    "world.entities": (20, None, True), "world.max_hops": (1, 4, True), "world.lineage_length": (2, 128, True),
    "train.eps_clip": (0, 1, False), "datagen.max_solver_accuracy": (0, 1, True), "datagen.dedup_threshold": (0, 1, False),
}
"""hexsearch/limits.py's table as it was when the ranges moved onto the fields (the record this test keeps)."""
OLD_MAY_BE_NEGATIVE = {"agent.invalid_penalty", "eval.temperature"}
AT_MOST_ZERO = {"agent.under_search_penalty"}
"""Penalties added after the table: negative or 0, never a bonus."""
OLD_RELATIONS = [("world.min_hops", "world.max_hops"), ("datagen.min_hops", "datagen.max_hops"),
                 ("datagen.target_hops", "datagen.max_hops"), ("train.eps_clip", "train.eps_clip_high")]

FIELDS = {key: value for key, _, value, _ in numeric_fields(HexConfig())}


def _bad_values(name: str) -> list[float]:
    """Values just outside the old range of `name` (the default rule: at least 0)."""
    low, high, inclusive = OLD_RANGES.get(name, (0, None, True))
    step = 1 if isinstance(FIELDS[name], int) else 0.5
    bad = [low - step if inclusive else low]
    return bad + ([high + step] if high is not None else [])


def _nested(name: str, value: float) -> dict:
    out: dict = {}
    *path, last = name.split(".")
    node = out
    for part in path:
        node = node.setdefault(part, {})
    node[last] = value
    return out


CASES = [(name, bad) for name in sorted(FIELDS) if name not in OLD_MAY_BE_NEGATIVE | AT_MOST_ZERO
         for bad in _bad_values(name)]


@pytest.mark.parametrize("name, bad", CASES)
def test_every_old_range_refuses_an_override(name, bad):
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"{name}={bad}"])
    assert str(e.value).startswith(f"{name}: ") and "is out of range: it must be" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", sorted(set(OLD_RANGES)
                                        | {n for n in FIELDS if n not in OLD_MAY_BE_NEGATIVE | AT_MOST_ZERO}))
def test_every_old_range_refuses_a_yaml_value(tmp_path, name):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(_nested(name, _bad_values(name)[-1])))
    with pytest.raises(ConfigError, match=rf"^{name}: .* is out of range: it must be"):
        load_config(path)


@pytest.mark.parametrize("name", sorted(AT_MOST_ZERO))
def test_a_penalty_may_be_negative_but_not_a_bonus(name):
    assert getattr(load_config(None, [f"{name}=-1"]).agent, name.split(".")[1]) == -1
    with pytest.raises(ConfigError, match=rf"^{name}: .* is out of range: it must be"):
        load_config(None, [f"{name}=0.5"])


@pytest.mark.parametrize("low, high", OLD_RELATIONS)
def test_old_relations_hold(tmp_path, low, high):
    ceiling = FIELDS[high]
    over = ceiling + (1 if isinstance(ceiling, int) else 0.1)
    with pytest.raises(ConfigError, match=rf"^{low}={over:g} is larger than {high}={ceiling:g}$"):
        load_config(None, [f"{low}={over}"])
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(_nested(low, over)))
    with pytest.raises(ConfigError, match="is larger than"):
        load_config(path)


def test_declared_ranges_match_the_old_table_and_allow_the_defaults():
    declared = {key: rng for key, _, _, rng in numeric_fields(HexConfig())}
    for name, (low, high, inclusive) in OLD_RANGES.items():
        rng = declared[name]
        assert (rng.low, rng.high, rng.low_inclusive) == (low, high, inclusive), name
    for name in OLD_MAY_BE_NEGATIVE:
        assert declared[name].low is None and declared[name].high is None
    assert {(k, k.rsplit(".", 1)[0] + "." + r.at_most) for k, r in declared.items() if r.at_most} == set(OLD_RELATIONS)
    assert range_problem(HexConfig()) is None
    cfg = load_config(None, ["eval.temperature=-1", "agent.invalid_penalty=-1"])
    assert cfg.agent.invalid_penalty == -1 and cfg.eval.temperature == -1


def test_ranged_metadata_sits_only_on_numbers_and_relations_name_siblings():
    seen: list[str] = []

    def walk(cls: type) -> None:
        types = field_types(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(types[f.name]):
                walk(types[f.name])
            rng = f.metadata.get("range")
            if rng is None:
                continue
            seen.append(f"{cls.__name__}.{f.name}")
            assert types[f.name] in (int, float) and isinstance(f.default, (int, float)), seen[-1]
            names = {g.name for g in dataclasses.fields(cls)}
            assert rng.at_most is None or rng.at_most in names, f"{cls.__name__}.{f.name}: {rng.at_most}"

    walk(HexConfig)
    assert "AgentConfig.max_turns" in seen and "LLMConfig.timeout_s" in seen  # nested sections were walked


@dataclasses.dataclass
class Inner:
    ratio: float = ranged(0.5, le=1)


@dataclasses.dataclass
class Outer:
    count: int = ranged(3, ge=1)
    floor: int = ranged(1, at_most="count")
    offset: float = ranged(-2.0, ge=None)
    plain: int = 0
    items: list[Inner] = dataclasses.field(default_factory=lambda: [Inner()])


def test_check_ranges_on_configs_built_in_code():
    check_ranges(Outer(), "top")
    with pytest.raises(ValueError, match=r"^top.count: 0 is out of range: it must be at least 1$"):
        check_ranges(Outer(count=0), "top")
    with pytest.raises(ValueError, match=r"^top.plain: -1 is out of range: it must be at least 0$"):
        check_ranges(Outer(plain=-1), "top")
    with pytest.raises(ValueError, match=r"^top.items\[0\].ratio: 2 is out of range: it must be at least 0 and at most 1$"):
        check_ranges(Outer(items=[Inner(ratio=2.0)]), "top")
    with pytest.raises(ValueError, match=r"^top.floor=4 is larger than top.count=3$"):
        check_ranges(Outer(floor=4), "top")
    assert range_problem(Outer(offset=-1e9)) is None
    assert field_range(dataclasses.fields(Outer)[3]) == Range()


def test_agent_built_in_code_checks_its_ranges():
    from agent.config import AgentConfig
    from agent.loop import Agent

    with pytest.raises(ValueError, match=r"^agent.max_turns: 0 is out of range"):
        Agent(None, [], AgentConfig(max_turns=0))  # type: ignore[arg-type]  # refused before the engine is used


def test_toolset_built_in_code_checks_its_ranges():
    from tools.config import ToolsConfig
    from tools.factory import ToolConfigError, build_tools

    with pytest.raises(ToolConfigError, match=r"^tools.topk: 0 is out of range: it must be at least 1$"):
        build_tools(ToolsConfig(topk=0))


def test_config_keys_show_each_numbers_range():
    from hexsearch.config import describe

    kinds = {key: kind for key, kind, _ in describe()}
    assert kinds["agent.max_turns"] == "int, at least 1 and at most 1000"
    assert kinds["world.min_hops"] == "int, at least 1, at most max_hops"
    assert kinds["agent.invalid_penalty"] == "float" and kinds["train.lr"] == "float, above 0"


def test_engine_and_judge_built_in_code_check_their_ranges():
    from agent.config import JudgeConfig
    from agent.judge import build_judge
    from serving.config import EngineConfig
    from serving.factory import build_engine

    with pytest.raises(ValueError, match=r"^engine.max_model_len: 0 is out of range: it must be at least 1$"):
        build_engine(EngineConfig(max_model_len=0))
    with pytest.raises(ValueError, match=r"^agent.judge.timeout_s: 0 is out of range: it must be above 0$"):
        build_judge(JudgeConfig(timeout_s=0.0))
