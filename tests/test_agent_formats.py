"""Format and protocol details: Hermes page reads, turn closing by EOS, tool budgets, validity prompts, judge reward."""

from __future__ import annotations

import json

from test_agent_loop import DOCS, ITEM, LONG_PAGE, PAGES, charwise, check_token_exact, tools

from agent.config import AgentConfig
from agent.events import AgentEvent
from agent.judge import LLMJudge
from agent.loop import run_episode
from agent.prompts import chat_markers
from agent.qa import QAItem
from serving.engines.scripted import ScriptedEngine
from tools.memory import MemoryPages, MemorySearch


def _call(name: str, **args) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def test_chat_markers_follow_the_template(tokenizer):
    m = chat_markers(tokenizer)
    assert m.assistant_end == "<|im_end|>\n" and m.eos_text == "<|im_end|>"
    assert m.user_open == "<|im_start|>user\n" and m.user_close == "<|im_end|>\n<|im_start|>assistant\n"
    assert m.tool_open == "<|im_start|>tool\n" and m.tool_between == "<|im_end|>\n<|im_start|>tool\n"
    assert m.end_rest("<|im_end|>") == "\n" and m.end_rest("") == "<|im_end|>\n"


async def test_hermes_page_is_read_chunk_by_chunk(tokenizer):
    eos = [tokenizer.eos_token_id]
    script = [charwise(tokenizer, _call("access", url="https://hexwiki.test/wiki/Varnholt")) + eos]
    script += [charwise(tokenizer, f"part {i} noted</think>") for i in range(3)]
    script += [charwise(tokenizer, "<answer>1642</answer>") + eos]
    engine = ScriptedEngine(script, tokenizer=tokenizer)
    cfg = AgentConfig(action_format="hermes", page_chunk_chars=1500)
    events: list[AgentEvent] = []
    traj = await run_episode(ITEM, engine, tools(), cfg, on_event=events.append)
    assert traj.stop_reason == "answered" and traj.num_turns == 5 and traj.reward == 1.0
    assert [t["kind"] for t in traj.meta["turns"]] == ["act", "read", "read", "read", "act"]
    read1 = tokenizer.decode(engine.calls[1].prompt_ids)
    assert read1.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n")
    assert "part 1 of 3]" in read1 and "Sentence 10 about" in read1
    read2 = tokenizer.decode(engine.calls[2].prompt_ids)
    assert "Sentence 10 about" not in read2 and "(read)" in read2  # chunk 1 is stubbed after its read turn
    # between read turns the assistant message is closed and the next chunk is a new tool message
    assert "part 0 noted</think><|im_end|>\n<|im_start|>tool\n<tool_response>" in read2
    check_token_exact(traj, engine, events, tokenizer)


async def test_hermes_answer_ends_the_turn(tokenizer):
    """An answer closes the Hermes turn: nothing the model would write after `</answer>` is generated
    (it was a format error that zeroed the reward, and tokens trained on)."""
    engine = ScriptedEngine([charwise(tokenizer, "<answer>1642</answer> and then more text")], tokenizer=tokenizer)
    events: list[AgentEvent] = []
    traj = await run_episode(ITEM, engine, tools(), AgentConfig(action_format="hermes"), on_event=events.append)
    assert traj.stop_reason == "answered" and traj.format_errors == 0 and traj.reward == 1.0
    assert tokenizer.decode(traj.segments[0].token_ids).endswith("<answer>1642</answer>")
    check_token_exact(traj, engine, events, tokenizer)


async def test_eos_without_action_reopens_the_conversation(tokenizer):
    eos = tokenizer.eos_token_id
    engine = ScriptedEngine([charwise(tokenizer, "I am not sure.") + [eos], "<answer>1642</answer>"],
                            tokenizer=tokenizer)
    events: list[AgentEvent] = []
    traj = await run_episode(ITEM, engine, tools(), AgentConfig(), on_event=events.append)
    assert traj.format_errors == 1 and traj.prediction == "1642"
    text = tokenizer.decode(engine.calls[1].prompt_ids)
    # the model's EOS closed its message (never a second <|im_end|>); the error comes as a user message
    assert text.endswith("I am not sure.<|im_end|>\n<|im_start|>user\nFormat error: no action found. Write one "
                         "action: <search> … </search>, <access> … </access>, <answer> … </answer>.<|im_end|>\n"
                         "<|im_start|>assistant\n")
    check_token_exact(traj, engine, events, tokenizer)


async def test_tool_budget_within_a_turn_and_across_turns(tokenizer):
    eos = [tokenizer.eos_token_id]
    three = "".join(_call("search", query=f"Entity {i} founded") for i in (1, 2, 3))
    engine = ScriptedEngine([charwise(tokenizer, three) + eos, charwise(tokenizer, three) + eos], tokenizer=tokenizer)
    cfg = AgentConfig(action_format="hermes", max_tool_calls=2, read_search_results=False)
    traj = await run_episode(ITEM, engine, tools(), cfg)
    assert traj.stop_reason == "max_tool_calls" and len(traj.tool_calls) == 2 and traj.num_turns == 2
    shown = tokenizer.decode(engine.calls[1].prompt_ids)
    assert "founded in 1501" in shown and "founded in 1502" in shown
    assert "Not run: the episode's tool-call budget is spent (search)." in shown


async def test_too_many_calls_in_one_turn_is_a_format_error(tokenizer):
    eos = [tokenizer.eos_token_id]
    three = "".join(_call("search", query=f"q{i}") for i in range(3))
    engine = ScriptedEngine([charwise(tokenizer, three) + eos, charwise(tokenizer, "<answer>x</answer>") + eos],
                            tokenizer=tokenizer)
    traj = await run_episode(ITEM, engine, tools(), AgentConfig(action_format="hermes", max_calls_per_turn=2))
    assert traj.format_errors == 1 and not traj.tool_calls and traj.reward == 0.0


async def test_validity_instruction_and_invalid_penalty(tokenizer):
    says_invalid = "<answer>the question is invalid.</answer>"
    forced = ScriptedEngine([says_invalid], tokenizer=tokenizer)
    traj = await run_episode(ITEM, forced, tools(), AgentConfig(valid_inst_ratio=1.0))
    assert traj.meta["forced_valid"] and traj.reward == -0.5 and traj.reward_info["invalid"]
    assert "give the most likely one" in tokenizer.decode(forced.calls[0].prompt_ids)
    free = ScriptedEngine([says_invalid], tokenizer=tokenizer)
    traj = await run_episode(ITEM, free, tools(), AgentConfig(valid_inst_ratio=0.0))
    assert not traj.meta["forced_valid"] and traj.reward == 0.0
    assert "the question is invalid. </answer>" in tokenizer.decode(free.calls[0].prompt_ids)


async def test_search_only_prompt_omits_access(tokenizer):
    engine = ScriptedEngine(["<access>https://x.test/</access>", "<answer>1642</answer>"], tokenizer=tokenizer)
    traj = await run_episode(ITEM, engine, {"search": MemorySearch(DOCS)}, AgentConfig())
    prompt = tokenizer.decode(engine.calls[0].prompt_ids)
    assert "<search> query </search>" in prompt and "<access>" not in prompt.split("<|im_start|>user")[0]
    assert traj.format_errors == 1 and "<access> is not available" in tokenizer.decode(engine.calls[1].prompt_ids)


async def test_judge_reward_with_aug_answers(tmp_path, tokenizer):
    item = QAItem("j", "In what year was Varnholt founded?", ["1642"], ["the 1640s"])
    judge_engine = ScriptedEngine(["Same year.\nVERDICT: CORRECT", "VERDICT: INCORRECT", "VERDICT: CORRECT"],
                                  tokenizer=tokenizer)
    judge = LLMJudge(judge_engine, "scripted", cache=tmp_path / "j.sqlite")
    cfg = AgentConfig(reward_fn="judge")
    traj = await run_episode(item, ScriptedEngine(["<answer>year 1642</answer>"], tokenizer=tokenizer), tools(), cfg,
                             judge=judge)
    assert traj.reward == 1.0 and traj.reward_info["judge"] is True and traj.reward_info["f1"] == 2 / 3
    # wrong for the gold answer, right for an aug answer: w = 0.3
    traj = await run_episode(item, ScriptedEngine(["<answer>early 1640s</answer>"], tokenizer=tokenizer), tools(), cfg,
                             judge=judge)
    assert traj.reward == 0.3 and traj.reward_info["judge"] is False and traj.reward_info["judge_aug"] is True
    assert judge.calls == 3


async def test_page_tool_chunks_are_used_and_page_argument_respected(tokenizer):
    from tools.protocol import Observation

    class ChunkedAccess:
        name = "access"
        schema = MemoryPages({}).schema

        async def __call__(self, args):
            chunks = ["alpha " * 5, "beta " * 5, "gamma " * 5]
            return Observation(text="Title: T\n[Chunk 1 of 3]\n" + chunks[0], data={
                "url": args["url"], "final_url": args["url"], "title": "T", "chunks": chunks})

    script = ['<tool_call>{"name": "access", "arguments": {"url": "https://t.test/", "page": 2}}</tool_call>',
              "b</think>", "c</think>", "<answer>x</answer>"]
    engine = ScriptedEngine(script, tokenizer=tokenizer)
    schema = {"type": "function", "function": {"name": "access", "parameters": {
        "type": "object", "properties": {"url": {"type": "string"}, "page": {"type": "integer"}}, "required": ["url"]}}}
    tool = ChunkedAccess()
    tool.schema = schema
    traj = await run_episode(ITEM, engine, {"access": tool}, AgentConfig(action_format="hermes"))
    assert traj.stop_reason == "answered" and traj.num_turns == 4
    first_read = tokenizer.decode(engine.calls[1].prompt_ids)
    assert "[T (https://t.test/) part 1 of 2]\nbeta" in first_read and "alpha" not in first_read
    assert LONG_PAGE and PAGES  # shared fixtures stay importable


async def test_prefill_modes(tokenizer):
    think = ScriptedEngine(["plan</think><answer>1642</answer>"], tokenizer=tokenizer)
    traj = await run_episode(ITEM, think, tools(), AgentConfig(prefill="think"))
    assert traj.prediction == "1642" and tokenizer.decode(think.calls[0].prompt_ids).endswith("assistant\n<think>\n")
    # `answer`: nothing written until the tool budget is spent, then <answer>
    answer = ScriptedEngine(["<search>Entity 4 founded</search>", "1504</answer>"], tokenizer=tokenizer)
    traj = await run_episode(ITEM, answer, tools(), AgentConfig(prefill="answer", max_tool_calls=1,
                                                                read_search_results=False))
    first, second = (tokenizer.decode(c.prompt_ids) for c in answer.calls)
    assert first.endswith("assistant\n") and second.endswith("</information>\n\n<answer>")
    assert traj.prediction == "1504"
    # prefill_tags=True is the same as prefill=tags
    tags = ScriptedEngine(["Entity 4 founded</search>", "1504</answer>"], tokenizer=tokenizer)
    traj = await run_episode(ITEM, tags, tools(), AgentConfig(prefill_tags=True, max_tool_calls=1,
                                                              read_search_results=False))
    assert traj.prediction == "1504" and traj.tool_calls[0].args == {"query": "Entity 4 founded"}


async def test_repeated_calls_close_the_tool_budget(tokenizer):
    # the same search three times in a row: the third is not run and <answer> is prefilled next
    script = ["Entity 4 founded</search>", "<search>Entity 3 founded</search>", "<search>Entity 3 founded</search>",
              "<search>Entity 3 founded</search>", "1504</answer>"]
    engine = ScriptedEngine(script, tokenizer=tokenizer)
    cfg = AgentConfig(prefill_tags=True, max_tool_calls=40, max_repeated_calls=3, read_search_results=False)
    traj = await run_episode(ITEM, engine, tools(), cfg)
    assert [c.args["query"] for c in traj.tool_calls] == ["Entity 4 founded"] + ["Entity 3 founded"] * 2
    last = tokenizer.decode(engine.calls[-1].prompt_ids)
    assert "the same call 3 times in a row" in last and last.endswith("<answer>")
    assert traj.prediction == "1504" and traj.meta["repeated_call"] is True
    # calls that alternate are not a repeat; 0 turns the rule off
    alternating = ["Entity 4 founded</search>"] + ["<search>Entity 3 founded</search>", "<search>Entity 2 founded</search>"] * 3
    for rule in (3, 0):
        engine = ScriptedEngine(alternating + ["<answer>1504</answer>"], tokenizer=tokenizer)
        cfg = AgentConfig(prefill_tags=True, max_tool_calls=40, max_repeated_calls=rule, read_search_results=False)
        traj = await run_episode(ITEM, engine, tools(), cfg)
        assert len(traj.tool_calls) == 7 and "repeated_call" not in traj.meta


async def test_a_call_revisited_in_a_cycle_closes_the_tool_budget(tokenizer):
    # A, B, A, B, A: no call twice in a row, but A's third time is not run when max_call_revisits=3
    cycle = ["Entity 4 founded</search>"] + ["<search>Entity 3 founded</search>", "<search>Entity 4 founded</search>"] * 2
    engine = ScriptedEngine(cycle + ["1504</answer>"], tokenizer=tokenizer)
    cfg = AgentConfig(prefill_tags=True, max_tool_calls=40, max_repeated_calls=3, max_call_revisits=3,
                      read_search_results=False)
    traj = await run_episode(ITEM, engine, tools(), cfg)
    assert [c.args["query"] for c in traj.tool_calls] == ["Entity 4 founded", "Entity 3 founded"] * 2
    last = tokenizer.decode(engine.calls[-1].prompt_ids)
    assert "the same call 3 times in this episode" in last and last.endswith("<answer>")
    assert traj.prediction == "1504" and traj.meta["repeated_call"] is True


async def test_user_prompt_layout_and_custom_instructions(tokenizer):
    engine = ScriptedEngine(["<answer>1642</answer>"], tokenizer=tokenizer)
    cfg = AgentConfig(prompt_layout="user", system_prompt="Custom rules: search, then answer.")
    await run_episode(ITEM, engine, tools(), cfg)
    text = tokenizer.decode(engine.calls[0].prompt_ids)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")  # template default
    assert "<|im_start|>user\nCustom rules: search, then answer.\n\nQuestion: In what year" in text


async def test_context_budget_respects_the_engine_limit(tokenizer):
    engine = ScriptedEngine(responder=lambda p, r: "<search>Entity 3 founded</search>", tokenizer=tokenizer)
    engine.max_model_len = 1200  # an engine that reports its context length
    traj = await run_episode(ITEM, engine, tools(), AgentConfig(context_policy="full", max_new_tokens=64, max_turns=200,
                                                                read_search_results=False))
    assert traj.stop_reason == "max_context" and traj.meta["context_tokens"] + 64 > 1200
    assert max(len(c.prompt_ids) for c in engine.calls) + 64 <= 1200
