"""Every pluggable kind of the eval and datagen side is a registry (core/registry.py): a user part named by
`pkg.mod:name` works where a built-in does, and an unknown name is an error that lists the valid ones."""

from __future__ import annotations

import asyncio
import json
import textwrap

import pytest
from test_datagen_synth import _cfg, _engine, _one_item, world  # noqa: F401 (world is a fixture)

from core.registry import ComponentError, Registry
from hexsearch.config import ConfigError, load_config

USER_MODULE = '''
from agent.qa import QAItem
from dataclasses import replace
from datagen.actions import Action
from datagen.record import Edit
from eval.judges import make_prompt
from eval.rows import SuiteData
from eval.suites import Suite
from tools.base import BaseTool, ToolResult


def load_lines(path, *, limit=None):
    """One `question | answer` per line."""
    lines = [ln for ln in open(path, encoding="utf-8").read().splitlines() if ln.strip()][:limit]
    items = [QAItem(id=f"l{i}", question=q.strip(), answers=[a.strip()], meta={"source": "lines"})
             for i, (q, a) in enumerate(ln.split("|") for ln in lines)]
    return SuiteData(items=items, source=str(path))


LINES = Suite("lines", load_lines, scorers=("regcase_len", "em"), judge="regcase_yes")


def length_match(prediction, golds):
    return float(prediction is not None and any(len(prediction) == len(g) for g in golds))


YES = make_prompt("regcase_yes", None, "Q: {question} G: {gold} P: {prediction}", lambda t: t.strip() == "yes")


async def twist(ctx, state):
    new = replace(state, question=state.question.replace("which year", "in which year exactly"))
    return new, Edit("twist", new.question != state.question, new.question, new.answer, note="twisted")


TWIST = Action("twist", twist)


class Echo(BaseTool):
    name = "echo"
    description = "Repeat the text."
    parameters = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

    async def run(self, args):
        return ToolResult(data=args["text"])

    def render(self, data, args):
        return str(data)


def echo_tool(ctx):
    return Echo(**ctx.base_kwargs())
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """`regcase_parts`: a user suite, scorer, judge prompt, datagen action and tool builder."""
    (tmp_path / "regcase_parts.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "regcase_parts"


def test_user_suite_scorer_and_judge_prompt_by_import_path(user_module, tmp_path):
    from eval.evaluate import score_rows
    from eval.judges import get_judge_prompt
    from eval.runner import judge_prompt_name, primary_for, scorers_for
    from eval.suites import get_suite, load_suite

    data = tmp_path / "qa.txt"
    data.write_text("Capital of France? | Paris\nTwo plus two? | four\n")
    cfg = load_config(None, [f"eval.suite={user_module}:LINES", f"eval.data={data}", "eval.judge=none",
                             f"eval.primary={user_module}:length_match"])
    suite = get_suite(cfg.eval.suite)
    assert suite.name == "lines" and suite.judge == "regcase_yes"
    assert scorers_for(cfg) == ["regcase_len", "em"] and primary_for(cfg) == f"{user_module}:length_match"
    loaded = load_suite(cfg.eval.suite, cfg.eval.data, limit=1)
    assert [i.answers for i in loaded.items] == [["Paris"]] and not loaded.encrypted
    # a user scorer by import path, scored beside a built-in one
    cfg = load_config(None, [f"eval.suite={user_module}:LINES", "eval.judge=none",
                             f"eval.scorers=[{user_module}:length_match,em]",
                             f"eval.primary={user_module}:length_match"])
    rows = asyncio.run(score_rows(cfg, [{"id": "a", "answer": "Paris", "prediction": "Lyons"},
                                        {"id": "b", "answer": "four", "prediction": "five!"}]))
    assert [r["score"] for r in rows] == [1.0, 0.0] and [r["scores"]["em"] for r in rows] == [0.0, 0.0]
    # a user judge prompt by import path
    prompt = get_judge_prompt(f"{user_module}:YES")
    assert prompt.parse("yes") is True and prompt.render("q", ["g"], "p")[-1]["content"] == "Q: q G: g P: p"
    cfg = load_config(None, [f"eval.suite={user_module}:LINES", f"eval.judge={user_module}:YES"])
    assert judge_prompt_name(cfg) == f"{user_module}:YES" and primary_for(cfg) == "judge"


def _scratch(monkeypatch, registry):
    """Registrations made by the test are undone after it (the registry's built-ins loaded first)."""
    registry.names()
    monkeypatch.setattr(registry, "_items", dict(registry._items))


def test_a_registered_suite_is_used_by_name(tmp_path, monkeypatch):
    from eval.runner import judge_prompt_name, scorers_for
    from eval.suites import SUITES, load_suite, suite

    _scratch(monkeypatch, SUITES)

    @suite("regcase-upper", scorers=("f1",), judge="gaia", encrypted=True)
    def load_upper(path, *, limit=None):
        from eval.loaders import load_localqa

        return load_localqa(path, limit=limit)

    assert "regcase-upper" in SUITES.names()
    data = tmp_path / "qa.jsonl"
    data.write_text(json.dumps({"question": "Q?", "answer": "A"}) + "\n")
    assert load_suite("regcase-upper", data).encrypted  # the record's flag reaches the data
    cfg = load_config(None, ["eval.suite=regcase-upper"])
    assert scorers_for(cfg) == ["f1"] and judge_prompt_name(cfg) == "gaia"
    with pytest.raises(ComponentError, match="already registered"):
        suite("regcase-upper")(lambda path, *, limit=None: None)


@pytest.mark.parametrize(("override", "expected"), [
    ("eval.suite=hle", "eval.suite: unknown eval suite 'hle'. Valid: xbench, browsecomp, gaia, frames, localqa, "
                       "world, world-test, world-dev, or an import path"),
    ("eval.scorers=[em,bleu]", "eval.scorers: unknown scorer 'bleu'. Valid: gaia, em, f1, sub_em, set_f1, cover_em, "
                               "asearcher_f1, or an import path"),
    ("eval.judge=strict", "eval.judge: unknown judge prompt 'strict'. Valid: auto, none, xbench, browsecomp, gaia, "
                          "asearcher, default, or"),
    ("eval.primary=bleu", "eval.primary: unknown scorer 'bleu'. Valid: auto, judge, gaia, em"),
    ("train.eval_suite=hle", "train.eval_suite: unknown eval suite 'hle'. Valid: '', xbench"),
    ("datagen.actions=[fuzz,twist]", "datagen.actions: unknown datagen action 'twist'. Valid: fuzz, inject, or"),
    ("tools.builtin=[search,calc]", "tools.builtin: unknown built-in tool 'calc'. Valid: search, access, or"),
])
def test_unknown_names_list_the_valid_ones(override, expected):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert expected in str(err.value)


def test_wrong_kind_of_object_is_named(user_module):
    from datagen.actions import get_action
    from eval.judges import get_judge_prompt
    from eval.suites import get_suite

    with pytest.raises(ComponentError, match="is a function, not an eval.suites.Suite"):
        get_suite(f"{user_module}:load_lines")
    with pytest.raises(ComponentError, match="is a Suite, not a datagen.actions.Action"):
        get_action(f"{user_module}:LINES")
    with pytest.raises(ComponentError, match="not a judge prompt"):
        get_judge_prompt(f"{user_module}:twist")
    with pytest.raises(ComponentError, match="has no attribute 'NOPE'"):
        get_suite(f"{user_module}:NOPE")


def test_user_tool_builder_by_import_path(user_module, monkeypatch):
    from tools.builtin import BUILTIN_TOOLS
    from tools.factory import ToolConfigError, build_tools

    _scratch(monkeypatch, BUILTIN_TOOLS)

    cfg = load_config(None, [f"tools.builtin=[{user_module}:echo_tool]", "tools.cache_enabled=false"])
    tools = build_tools(cfg.tools)
    assert list(tools) == ["echo"]
    obs = asyncio.run(tools["echo"]({"text": "hello"}))
    assert obs.ok and obs.text == "hello"
    BUILTIN_TOOLS.add("regcase_echo", BUILTIN_TOOLS.resolve(f"{user_module}:echo_tool"))
    cfg = load_config(None, ["tools.builtin=[regcase_echo]", "tools.cache_enabled=false"])
    assert list(build_tools(cfg.tools)) == ["echo"]  # registered by name, like the built-ins
    cfg = load_config(None, ["tools.builtin=[regcase_echo]", f"tools.builtin=[regcase_echo,{user_module}:echo_tool]"])
    with pytest.raises(ToolConfigError, match="a tool named 'echo' already exists"):
        build_tools(cfg.tools)


def test_user_datagen_action_by_import_path(user_module, world, tokenizer):  # noqa: F811
    engine, model = _engine(tokenizer)
    model.solver_knows = lambda q: "exactly" not in q
    cfg = _cfg(world, min_hops=1, target_hops=1, max_edits=2, actions=[f"{user_module}:TWIST"])
    item = asyncio.run(_one_item(cfg, engine, index=1))
    assert item["status"] == "accepted", item["reason"]
    assert [e["action"] for e in item["edits"]] == ["base", "twist"]
    assert "in which year exactly" in item["question"] and item["edits"][1]["note"] == "twisted"
    assert [c["name"] for c in item["edits"][1]["checks"]][:2] == ["guard", "validity"]  # checked like a built-in


def test_hop_adding_actions_are_chosen_first_and_not_past_max_hops(user_module):
    import random

    from datagen.actions import QAState
    from datagen.config import DatagenConfig
    from datagen.synth import Synthesiser

    synth = Synthesiser(DatagenConfig(actions=[f"{user_module}:TWIST", "inject"], min_hops=1, target_hops=2,
                                      max_hops=2), store=None, models=None)
    shallow, deep = (QAState("q", "a", [], ["p"] * hops) for hops in (1, 2))
    assert synth.choose(shallow, random.Random(0)).name == "inject"
    assert {synth.choose(deep, random.Random(s)).name for s in range(20)} == {"twist"}
    assert Synthesiser(DatagenConfig(actions=[]), store=None, models=None).choose(shallow, random.Random(0)) is None


def test_registry_imports_its_builtin_modules_on_first_lookup(tmp_path, monkeypatch):
    (tmp_path / "regcase_builtin.py").write_text(textwrap.dedent('''
        from core.registry import REGISTRIES
        REGISTRIES["regcase.kind"].add("one", 1)
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = Registry("regcase thing", "regcase.kind", builtins=("regcase_builtin",))
    reg.add("zero", 0)  # registering does not import the built-ins
    assert reg.names() == ["zero", "one"] and reg.resolve("one") == 1
    reg.check("auto", ("auto",))
    with pytest.raises(ComponentError, match=r"other.key: unknown regcase thing 'two'. Valid: auto, zero, one"):
        reg.check("two", ("auto",), key="other.key")
