"""Bring your own agent (agent/openai_agent.py): unmodified programs written against the `openai` SDK and the
OpenAI Agents SDK, served by the recording endpoint over real loopback HTTP, become token-exact trajectories
that the learner trains on; failures never do; one episode cannot reach another's calls."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from fixtures import byo_agents

from agent.qa import QAItem
from agent.workflow import make_workflow
from hexsearch.config import ConfigError, HexConfig, load_config
from serving.engines.scripted import ScriptedEngine, ScriptedOutput
from trainer.controller import INFRA_STOPS

ITEM = QAItem("q1", "In what year was Varnholt founded?", ["1642"])
CALL = '<tool_call>\n{"name": "search", "arguments": {"query": "Varnholt founded"}}\n</tool_call><|im_end|>'
FIXTURES = Path(__file__).parent / "fixtures"


def config(program: str = "", command: list[str] | None = None, **agent) -> HexConfig:
    cfg = HexConfig()
    cfg.agent.program, cfg.agent.command = program, list(command or [])
    for k, v in agent.items():
        setattr(cfg.agent, k, v)
    return cfg


def search_engine(tokenizer, answers: dict[str, str] | None = None, hold: str = "") -> ScriptedEngine:
    """Calls the search tool until the page is in the prompt, then answers (per request id: `answers`); the
    answer of request `hold` parks after two tokens until the engine is paused."""
    def respond(ids, request):
        if "founded in 1642" not in tokenizer.decode(ids):
            return CALL
        text = (answers or {}).get(request.request_id, "1642") + "<|im_end|>"
        return ScriptedOutput(text=text, hold_after=2) if request.request_id == hold else text
    return ScriptedEngine(responder=respond, tokenizer=tokenizer)


async def episode(cfg, engine, item=ITEM, request_id="g/0", seed=1):
    workflow = make_workflow(cfg)
    try:
        return await workflow.arun_episode(engine, item, seed=seed, request_id=request_id), workflow.stats()
    finally:
        await workflow.aclose()


def assert_token_exact(traj, engine) -> None:
    """Every policy token of the trajectory is one the engine sampled, in order, with its log-prob and version;
    every other token was in the prompt the engine saw."""
    calls = [c for c in engine.calls if c.request_id == traj.meta["request_id"]]
    sampled = [(t, lp, v) for c in calls for t, lp, v in zip(c.completion.output_ids, c.completion.logprobs,
                                                              c.completion.versions, strict=True)]
    trained = [(t, lp, v) for s in traj.segments
               for t, lp, v, m in zip(s.token_ids, s.logprobs, s.versions, s.loss_mask, strict=True) if m]
    assert trained == sampled and sampled
    for c in calls:  # each call is a prefix of its segment: prompt then its completion
        seen = list(c.prompt_ids) + list(c.completion.output_ids)
        assert any(s.token_ids[:len(seen)] == seen for s in traj.segments)


def test_config_selects_the_workflow_and_refuses_bad_programs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["agent.command=[python,my_agent.py]"])
    assert cfg.agent.command_cwd == str(tmp_path)  # fixed where the config loads: relative paths hold in workers
    assert type(make_workflow(cfg)).__name__ == "OpenAIAgentWorkflow"
    with pytest.raises(ConfigError, match="agent.program: 'my_agent' is not an import path"):
        load_config(None, ["agent.program=my_agent"])
    with pytest.raises(ConfigError, match="exclusive"):
        load_config(None, ["agent.program=a:b", "agent.command=[python,x.py]"])
    with pytest.raises(ConfigError, match="needs agent.program"):
        load_config(None, ["train.workflow=openai_agent"])


async def test_openai_sdk_tool_calls_train_token_exact_across_a_weight_update(tokenizer, tiny_model_spec):
    """Two episodes of one group through the openai SDK tool loop; the final call of each is cut by a weight
    update and continued. The learner trains on exactly the sampled tokens, and the reward sets the direction."""
    from trainer.batch import build_samples
    from trainer.buffer import Group
    from trainer.config import TrainConfig
    from trainer.learner import Learner

    engine = search_engine(tokenizer, {"g/1": "1700"}, hold="g/0")
    cfg = config("fixtures.byo_agents:sdk_agent")
    workflow = make_workflow(cfg)
    run = asyncio.gather(*(workflow.arun_episode(engine, ITEM, seed=i, request_id=f"g/{i}") for i in range(2)))
    await engine.wait_held()
    await engine.pause("abort")
    await engine.update_weights("step-1", 1)
    await engine.resume()
    trajs = await run
    stats = workflow.stats()
    await workflow.aclose()
    for traj in trajs:
        assert traj.stop_reason == "answered" and len(traj.segments) == 1
        assert [t["how"] for t in traj.meta["turns"]] == ["first", "extends"]
        assert [(c.name, c.args) for c in traj.tool_calls] == [("search", {"query": "Varnholt founded"})]
        assert_token_exact(traj, engine)
    assert set(trajs[0].segments[0].versions) == {-1, 0, 1}  # the answer spans the update, each token its version
    assert [t.prediction for t in trajs] == ["1642", "1700"] and [t.reward for t in trajs] == [1.0, 0.0]
    assert stats["openai_agent/calls"] == 4 and stats["openai_agent/failed"] == 0

    samples, kept = build_samples([Group("q1", "q1", trajs, admitted_version=0)], "grpo", "drop")
    assert kept == 1 and [s.token_ids for s in samples] == [t.segments[0].token_ids for t in trajs]
    assert samples[0].advantage > 0 > samples[1].advantage
    learner = Learner(TrainConfig(precision="fp32", lr=1e-2, grad_clip=0, micro_batch_tokens=4096), tiny_model_spec)
    for s, lp in zip(samples, learner.logprobs(samples), strict=True):
        s.logprobs = lp  # on-policy for the tiny model (the scripted engine's log-probs are synthetic)
    before = learner.logprobs(samples)
    out = learner.train_step(samples, version=1)
    after = learner.logprobs(samples)
    assert out["train/policy_tokens"] == sum(s.num_loss_tokens for s in samples) == sum(t.num_generated for t in trajs)
    differ = [i for i, (x, y) in enumerate(zip(*(s.token_ids for s in samples), strict=True)) if x != y]
    assert differ  # the answer digits: the tool-call turn and the end of turn are the same in both
    for s, b, a in zip(samples, before, after, strict=True):
        assert sum(a[i] - b[i] for i in differ) * s.advantage > 0  # the reward reached the loss: the right answer up


async def test_agents_sdk_drives_an_evaluation_and_a_training_group(tokenizer, tmp_path):
    from core.rundir import RunDir
    from eval.runner import eval_workflow_config, run_samples
    from trainer.batch import build_samples
    from trainer.buffer import Group

    cfg = load_config(None, ["agent.program=fixtures.byo_agents:agents_sdk_agent", "engine.model=tiny-random",
                             "eval.n=2", "eval.judge=none"])
    run = RunDir.create(tmp_path / "runs", "eval")
    run_cfg = eval_workflow_config(cfg, run)
    engine = search_engine(tokenizer)
    workflow = make_workflow(run_cfg)
    rows = await run_samples(run_cfg, run, [ITEM], engine=engine, workflow=workflow)
    await workflow.aclose()
    assert [r["prediction"] for r in rows] == ["1642", "1642"] and all(r["correct"] for r in rows)
    assert [r["tool_calls"] for r in rows] == [1, 1] and {r["stop_reason"] for r in rows} == {"answered"}

    engine = search_engine(tokenizer, {"t/1": "1700"})
    workflow = make_workflow(cfg)
    trajs = await asyncio.gather(*(workflow.arun_episode(engine, ITEM, seed=i, request_id=f"t/{i}") for i in range(2)))
    await workflow.aclose()
    for traj in trajs:
        assert_token_exact(traj, engine)
        assert len(traj.segments) == 1 and traj.meta["segment_splits"] == 0
    samples, kept = build_samples([Group("q1", "q1", list(trajs), admitted_version=0)], "grpo", "drop")
    assert kept == 1 and samples[0].advantage > 0 > samples[1].advantage


async def test_a_history_rewrite_is_split_into_segments(tokenizer):
    engine = search_engine(tokenizer)
    traj, stats = await episode(config("fixtures.byo_agents:rewriting_agent"), engine)
    assert traj.stop_reason == "answered" and traj.prediction == "1642"
    assert [t["how"] for t in traj.meta["turns"]] == ["first", "new"]
    assert len(traj.segments) == 2 and traj.meta["segment_splits"] == 1 and stats["openai_agent/segment_splits"] == 1
    assert_token_exact(traj, engine)
    assert "Notes: Varnholt" in tokenizer.decode(traj.segments[1].token_ids)
    assert "Notes: Varnholt" not in tokenizer.decode(traj.segments[0].token_ids)
    assert traj.reward == 0.25 and traj.reward_info["program_reward"] == 0.25 and traj.reward_info["scored"] == 1.0


async def test_re_rendering_that_changes_sampled_tokens_is_detected_and_the_sampled_tokens_kept(tokenizer):
    """The model wrote its tool call without spaces; the history re-rendered by the template has them. The
    next prompt keeps the tokens as sampled (one segment, counted), never the re-rendered text."""
    terse = '<tool_call>\n{"name":"search","arguments":{"query":"Varnholt founded"}}\n</tool_call><|im_end|>'
    engine = ScriptedEngine([terse, "1642<|im_end|>"], tokenizer=tokenizer)
    traj, stats = await episode(config("fixtures.byo_agents:sdk_agent"), engine)
    assert [t["how"] for t in traj.meta["turns"]] == ["first", "retokenized"]
    assert len(traj.segments) == 1 and stats["openai_agent/retokenized_calls"] == 1
    assert_token_exact(traj, engine)
    text = tokenizer.decode(traj.segments[0].token_ids)
    assert '{"name":"search"' in text and '{"name": "search"' not in text.split("<|im_start|>user")[-1]
    assert traj.prediction == "1642"


@pytest.mark.parametrize("program, command, failure, error", [
    ("fixtures.byo_agents:crashing_agent", None, "raised", "RuntimeError: the agent fell over"),
    ("fixtures.byo_agents:hanging_agent", None, "wall_clock", "agent.wall_clock_s=2"),
    ("fixtures.byo_agents:silent_agent", None, "no_calls", "never called the endpoint"),
    ("", [sys.executable, str(FIXTURES / "byo_agent_cmd.py"), "crash"], "exit_code", "the tool server is unreachable"),
    ("", [sys.executable, str(FIXTURES / "byo_agent_cmd.py"), "hang"], "wall_clock", "was killed"),
])
async def test_failing_programs_are_failed_episodes(tokenizer, program, command, failure, error):
    traj, stats = await episode(config(program, command, wall_clock_s=2.0), search_engine(tokenizer))
    assert traj.stop_reason in INFRA_STOPS and traj.meta["failure"] == failure and error in traj.meta["error"]
    assert traj.prediction is None and traj.reward == 0.0 and stats["openai_agent/failed"] == 1


def test_a_failed_episode_is_requeued_with_its_error_in_the_ledger_and_never_trained_on(tokenizer, tmp_path):
    from types import SimpleNamespace

    from trainer.buffer import GroupBuffer
    from trainer.controller import RolloutController
    from trainer.data import QuestionStream
    from trainer.staleness import StalenessController

    byo_agents.FLAKY_RUNS.clear()
    items = [ITEM, QAItem("q2", ITEM.question, ["1642"])]

    async def main():
        engine = search_engine(tokenizer)
        workflow = make_workflow(config("fixtures.byo_agents:flaky_agent"))

        def remote(question, group_id, n, seed):
            return asyncio.ensure_future(asyncio.gather(*(
                workflow.arun_episode(engine, question, seed=seed + i, request_id=f"{group_id}/{i}") for i in range(n))))
        ctl = RolloutController(stream=QuestionStream(items, seed=0), workers=[SimpleNamespace(
            run_group=SimpleNamespace(remote=remote))], staleness=StalenessController(2, 2, 2, 8),
            buffer=GroupBuffer(), group_size=2, filter_groups="none", ledger=tmp_path / "rollouts.jsonl")
        ctl.start()
        groups = []
        try:  # batches until q1's requeued run is trained: q2 may fill a batch first under load
            while not any(g.question_id == "q1" for g in groups) and len(groups) < 8:
                groups += await asyncio.wait_for(ctl.next_batch(1, 0, 0), 120)
        finally:
            ctl._paused = True
            ctl._task.cancel()
            running = [task for _, task in ctl.in_flight.values()]
            for task in running:  # the groups still running: cancelled, their keys close with them
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            await workflow.aclose()
        return groups

    groups = asyncio.run(main())
    ledger = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    failed = [e for e in ledger if e["event"] == "failed"]
    assert len(failed) == 1 and failed[0]["requeued"] and "RuntimeError: the agent fell over" in failed[0]["error"]
    after = ledger[ledger.index(failed[0]) + 1:]
    assert any(e["event"] == "admit" and e["key"] == failed[0]["key"] for e in after)  # its question runs again
    assert groups[-1].question_id == "q1" and byo_agents.FLAKY_RUNS["q1"] >= 2
    assert all(t.stop_reason == "answered" for g in groups for t in g.trajectories)


async def test_one_episode_cannot_reach_another_episodes_calls(tokenizer):
    byo_agents.SPY.clear()
    engine = ScriptedEngine(responder=lambda ids, req: "hello<|im_end|>", tokenizer=tokenizer)
    workflow = make_workflow(config("fixtures.byo_agents:spying_agent"))
    first = await workflow.arun_episode(engine, ITEM, seed=0, request_id="ep/0")
    second = await workflow.arun_episode(engine, ITEM, seed=1, request_id="ep/1")
    stats = workflow.stats()
    await workflow.aclose()
    assert second.stop_reason == "answered", second.meta.get("error")
    codes = json.loads(second.prediction)
    assert codes["stolen"] == codes["made_up"] == codes["none"] == 401  # a key dies with its episode
    assert codes["/calls"] == codes["/episodes"] == codes["/../calls"] == 404  # no route reads calls
    assert codes["/models"] == codes["own"] == 200
    assert stats["openai_agent/refused_keys"] == 3
    assert first.num_turns == 1 and second.num_turns == 1  # the second episode's call counts in its own only
    assert [c.request_id for c in engine.calls] == ["ep/0", "ep/1"]  # a body/header request id changes nothing


async def test_a_command_gets_a_minimal_environment(tokenizer, monkeypatch):
    monkeypatch.setenv("HEXSEARCH_ENGINE_TOKEN", "secret-engine-token")
    monkeypatch.setenv("MY_AGENT_SETTING", "x")
    cfg = config(command=[sys.executable, str(FIXTURES / "byo_agent_cmd.py"), "answer"],
                 command_env=["MY_AGENT_SETTING"])
    traj, _ = await episode(cfg, search_engine(tokenizer))
    assert traj.stop_reason == "answered" and traj.num_turns == 1
    names = set(json.loads(traj.prediction)) - {"LC_CTYPE", "__CF_USER_TEXT_ENCODING"}  # set by the interpreter
    assert {"OPENAI_BASE_URL", "OPENAI_API_KEY", "MY_AGENT_SETTING"} <= names
    assert names <= {"PATH", "LANG", "LC_ALL", "TMPDIR", "TZ", "OPENAI_BASE_URL", "OPENAI_API_KEY", "MY_AGENT_SETTING"}


async def test_a_real_engine_serves_the_program_and_ask_runs_it(tiny_model_spec):
    """The embedded engine (the tiny model) behind the endpoint: its sampled ids, log-probs and versions are
    the trajectory's, and `hexsearch ask`'s episode runs the same program."""
    from hexsearch.commands.ask import TracePrinter, ask_episode
    from serving.engines.embedded import EmbeddedEngine

    engine = EmbeddedEngine(tiny_model_spec, dtype="float32", device="cpu", max_batch_size=4)
    calls = []
    original = engine.generate

    async def recording(request, **kw):
        out = await original(request, **kw)
        calls.append((list(request.prompt_ids), out))
        return out
    engine.generate = recording
    cfg = config("fixtures.byo_agents:sdk_agent", max_new_tokens=12, temperature=1.0)
    workflow = make_workflow(cfg)
    traj = await ask_episode(ITEM, engine, workflow, printer=TracePrinter(quiet=True), seed=3)
    await workflow.aclose()
    assert traj.stop_reason in ("answered", "no_answer") and traj.num_turns == len(calls) >= 1
    trained = [t for s in traj.segments for t, m in zip(s.token_ids, s.loss_mask, strict=True) if m]
    assert trained == [t for _, out in calls for t in out.output_ids]
    assert [v for s in traj.segments for v, m in zip(s.versions, s.loss_mask, strict=True) if m] == \
        [v for _, out in calls for v in out.versions]
    assert traj.segments[0].token_ids[:len(calls[0][0])] == calls[0][0]
