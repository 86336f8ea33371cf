"""The episode contract and plug-ins: workflows, reward functions, context policies and tools named by
import path, action tags derived from tool names, and the guarantees user tools get."""

from __future__ import annotations

import time

import pytest

from agent.config import AgentConfig
from agent.context import make_policy
from agent.qa import QAItem
from agent.rewards import REWARDS
from agent.workflow import SearchAgentWorkflow, make_workflow
from core.registry import ComponentError, Registry, import_object
from hexsearch.config import ConfigError, HexConfig, load_config
from serving.engines.scripted import ScriptedEngine
from tools.config import ToolsConfig
from tools.factory import ToolConfigError, build_tools, open_toolset

ITEM = QAItem("q1", "In what year was Varnholt founded?", ["1642"])
ECHO = {"_component_": "fixtures.plugins:Echo"}


def hex_config(agent: AgentConfig | None = None, tools: ToolsConfig | None = None, workflow: str = "search_agent"):
    cfg = HexConfig(agent=agent or AgentConfig(read_search_results=False), tools=tools or ToolsConfig(builtin=[]))
    cfg.train.workflow = workflow
    return cfg


def decoded(tokenizer, traj) -> str:
    return "".join(tokenizer.decode(s.token_ids) for s in traj.segments)


async def test_a_component_tool_gets_its_own_action_tag(tokenizer):
    cfg = hex_config(tools=ToolsConfig(builtin=[], components=[ECHO]))
    engine = ScriptedEngine(["<echo>hello there</echo>", "<answer>1642</answer>"], tokenizer=tokenizer)
    workflow = make_workflow(cfg)
    traj = await workflow.arun_episode(engine, ITEM, seed=1, request_id="r1")
    await workflow.aclose()
    assert traj.stop_reason == "answered" and traj.reward == 1.0
    assert [(c.name, c.args) for c in traj.tool_calls] == [("echo", {"text": "hello there"})]
    text = decoded(tokenizer, traj)
    assert "- <echo> text </echo>: Repeat the text back." in text  # the prompt lists the tool's tag
    assert "<information>\necho: hello there\n</information>" in text
    assert "</echo>" in workflow.agent_for(engine).fmt.act_stops


async def test_a_several_parameter_tool_takes_json_in_its_tag(tokenizer):
    cfg = hex_config(tools=ToolsConfig(builtin=[], components=[{"_component_": "fixtures.plugins:Adder"}]))
    engine = ScriptedEngine(['<add>{"a": 2, "b": 40}</add>', "<add>2 and 40</add>", "<answer>42</answer>"],
                            tokenizer=tokenizer)
    workflow = make_workflow(cfg)
    traj = await workflow.arun_episode(engine, QAItem("q", "2 + 40?", ["42"]), seed=0, request_id="r")
    assert traj.tool_calls[0].args == {"a": 2, "b": 40} and traj.tool_calls[0].error is None
    assert "sum = 42" in decoded(tokenizer, traj)
    assert traj.tool_calls[1].error  # plain text is not the two integers: an error observation, not a crash
    assert traj.stop_reason == "answered"


async def test_component_tools_get_timeouts_errors_as_observations_and_counters():
    cfg = ToolsConfig(builtin=[], timeout_s=0.2, retries=0, components=[
        {"_component_": "fixtures.plugins:Echo", "sleep_s": 5.0, "name": "slow"},
        {"_component_": "fixtures.plugins:Echo", "fail": True, "name": "broken"}, ECHO])
    tools = build_tools(cfg)
    t0 = time.perf_counter()
    slow = await tools["slow"]({"text": "x"})
    assert slow.error and "timed out" in slow.error and time.perf_counter() - t0 < 2.0
    broken = await tools["broken"]({"text": "x"})
    assert broken.error and "echo exploded" in broken.error
    ok = await tools["echo"]({"text": "hi"})
    assert ok.ok and ok.text == "echo: hi" and ok.data == {"echoed": "hi"}
    missing = await tools["echo"]({})
    assert missing.error and "text" in missing.error  # the schema's required argument is enforced
    stats = tools["echo"].stats()
    assert stats["tools/echo/calls"] == 2 and stats["tools/echo/errors"] == 1
    assert tools["slow"].stats()["tools/slow/timeouts"] == 1


def test_bad_components_are_clear_errors():
    def build(*components, builtin=()):
        return build_tools(ToolsConfig(builtin=list(builtin), components=list(components)))

    with pytest.raises(ComponentError, match="cannot import module 'no_such_module'"):
        build({"_component_": "no_such_module:Tool"})
    with pytest.raises(ComponentError, match="has no attribute 'Nope'"):
        build({"_component_": "fixtures.plugins:Nope"})
    with pytest.raises(ToolConfigError, match="lacks the Tool protocol"):
        build({"_component_": "fixtures.plugins:NotAWorkflow"})
    with pytest.raises(ToolConfigError, match="already exists"):
        build(ECHO, ECHO)
    with pytest.raises(ToolConfigError, match="not valid"):
        build({"_component_": "fixtures.plugins:Echo", "name": "two words"})
    with pytest.raises(ToolConfigError, match="cannot build"):
        build({"_component_": "fixtures.plugins:Echo", "colour": "red"})
    with pytest.raises(ToolConfigError, match="_component_"):
        build({"name": "x"})
    with pytest.raises(ValueError, match="browser.*search, access"):
        build(builtin=["browser"])


async def test_open_toolset_records_where_each_tool_comes_from():
    toolset = await open_toolset(ToolsConfig(builtin=[], components=[ECHO]))
    try:
        assert list(toolset) == ["echo"] and toolset.sources["echo"] == "component fixtures.plugins:Echo"
    finally:
        await toolset.aclose()


@pytest.mark.parametrize("spec, reward, info_key", [
    ("fixtures.plugins:length_reward", 0.5, None),
    ("fixtures.plugins:async_reward", 0.4, "async_reward"),
])
async def test_reward_function_by_import_path(tokenizer, spec, reward, info_key):
    cfg = hex_config(agent=AgentConfig(reward_fn=spec))
    engine = ScriptedEngine(["<answer>1642</answer>"], tokenizer=tokenizer)
    traj = await make_workflow(cfg).arun_episode(engine, ITEM, seed=0, request_id="r")
    assert traj.reward == pytest.approx(reward)
    assert traj.reward_info["metric"] == spec and (info_key is None or traj.reward_info[info_key])


async def test_a_reward_function_returning_nonsense_is_recorded_not_raised(tokenizer):
    cfg = hex_config(agent=AgentConfig(reward_fn="fixtures.plugins:bad_reward"))
    engine = ScriptedEngine(["<answer>1642</answer>"], tokenizer=tokenizer)
    traj = await make_workflow(cfg).arun_episode(engine, ITEM, seed=0, request_id="r")
    assert traj.stop_reason == "answered" and traj.reward == 0.0
    assert "finite number" in traj.reward_info["error"]


async def test_context_policy_by_import_path_is_used(tokenizer):
    from tools.memory import MemorySearch

    docs = [{"title": "Varnholt", "url": "u", "contents": "Varnholt was founded in 1642."}]
    script = ["<search>Varnholt</search>", "Founded 1642.</think>", "<answer>1642</answer>"]
    segments = {}
    for policy in ("read_once", "fixtures.plugins:StubEverything"):
        cfg = hex_config(agent=AgentConfig(context_policy=policy, read_search_results=True))
        workflow = SearchAgentWorkflow(cfg, tools={"search": MemorySearch(docs)})
        traj = await workflow.arun_episode(ScriptedEngine(list(script), tokenizer=tokenizer), ITEM, seed=0)
        assert traj.stop_reason == "answered"
        segments[policy] = len(traj.segments)
    assert segments == {"read_once": 1, "fixtures.plugins:StubEverything": 2}  # the user policy stubbed the result
    assert type(make_policy(AgentConfig(context_policy="fixtures.plugins:StubEverything"))).__name__ == "StubEverything"
    with pytest.raises(ComponentError, match="not a ContextPolicy subclass"):
        make_policy(AgentConfig(context_policy="fixtures.plugins:Echo"))


async def test_workflow_by_import_path(tokenizer):
    from fixtures.plugins import CountingWorkflow

    cfg = hex_config(workflow="fixtures.plugins:CountingWorkflow", tools=ToolsConfig(builtin=[], components=[ECHO]))
    workflow = make_workflow(cfg)
    assert isinstance(workflow, CountingWorkflow)
    engine = ScriptedEngine(["<answer>1642</answer>"], tokenizer=tokenizer)
    before = CountingWorkflow.episodes
    traj = await workflow.arun_episode(engine, ITEM, seed=0, request_id="r")
    assert traj.meta["counted"] == before + 1 and traj.reward == 1.0
    greedy = workflow.with_temperature(0.0)
    await greedy.setup()
    assert greedy.tools is workflow.tools and greedy.cfg.agent.temperature == 0.0  # shared, not reopened
    assert workflow.cfg.agent.temperature == 1.0
    await workflow.aclose()
    constant = make_workflow(hex_config(workflow="fixtures.plugins:ConstantWorkflow"))
    assert (await constant.arun_episode(engine, ITEM, seed=0, request_id="x")).prediction == "42"
    with pytest.raises(ComponentError, match="not a subclass of agent.workflow.Workflow"):
        make_workflow(hex_config(workflow="fixtures.plugins:NotAWorkflow"))


def test_component_fields_are_checked_at_config_load():
    cfg = load_config(None, ["agent.reward_fn=fixtures.plugins:length_reward",
                             "agent.context_policy=fixtures.plugins:StubEverything",
                             "train.workflow=fixtures.plugins:CountingWorkflow"])
    assert cfg.agent.reward_fn == "fixtures.plugins:length_reward"
    for key, valid in (("agent.reward_fn", "em, f1, sub_em, set_f1, judge"),
                       ("agent.context_policy", "full, read_once, keep_last_k"),
                       ("train.workflow", "search_agent")):
        with pytest.raises(ConfigError) as err:
            load_config(None, [f"{key}=f1_score"])
        assert key in str(err.value) and valid in str(err.value) and "package.module:attribute" in str(err.value)


def test_registry_rules():
    reg = Registry("gadget", "test.gadget")
    reg.register("a")(len)
    reg.register("a")(len)  # the same object again is fine
    with pytest.raises(ComponentError, match="already registered"):
        reg.add("a", max)
    assert reg.resolve("a") is len and reg.resolve("builtins:max") is max
    with pytest.raises(ComponentError, match="unknown gadget 'b'. Valid: a"):
        reg.resolve("b")
    with pytest.raises(ComponentError, match="not an import path"):
        import_object("no colon here")
    assert set(REWARDS.names()) >= {"f1", "em", "sub_em", "set_f1", "judge"}
