"""The episode loop: one question in, one token-exact Trajectory out.

    traj = await run_episode(item, engine, tools, config, request_id=..., seed=...)

Turn types (ASearcher's protocol): an *act* turn generates until an action's closing tag (or EOS);
its tool calls run concurrently; each page chunk, and each search result when
`read_search_results`, is then shown in its own *read* turn: the result, then `<think>` written by
the harness, and the model writes notes until `</think>`. After the read turn the context policy may
stub the result (see agent/context.py). Every LLM call goes through
`serving.protocol.generate_continuing`, so a call aborted by a weight update continues under the new
weights and each token keeps the version that produced it. All calls of an episode share one
request id (sticky routing, KV reuse).

Budgets are independent and each stop is recorded in `Trajectory.stop_reason`: `answered`,
`max_turns`, `max_tool_calls`, `max_context`, `wall_clock`, `max_cost`, `max_tokens`, `format_errors`, `engine_error`,
`engine_abort` (a call that never finished), `agent_error` (a bug in the harness, with the error in
`meta`). Engine and tool failures never raise out of `run_episode`; tool failures become error
observations the model sees.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from typing import Any, get_args

from agent.config import AgentConfig, Prefill
from agent.context import Block, TokenContext, make_policy, trim_tail
from agent.episode_tools import Delivery, as_item, call_tool, check_schema, deliveries_for
from agent.events import AgentEvent, EventFn
from agent.formats import make_format
from agent.parser import parse_read
from agent.prompts import CONTINUE_NUDGE, FORMAT_ERROR, render_prompt
from agent.qa import question_bucket
from agent.rewards import RewardFn, resolve_reward, score_episode
from agent.trajectory import Trajectory, call_key
from core.choices import check_choices
from core.log import get_logger
from core.ranges import check_ranges
from serving.protocol import GenerateRequest, InferenceEngine, SamplingParams, generate_continuing
from tools.protocol import Tool

log = get_logger(__name__)
PREFILL_MODES: tuple[str, ...] = get_args(Prefill)


class Agent:
    """The search agent bound to an engine, tools and a config; `run` plays one episode."""

    def __init__(self, engine: InferenceEngine, tools: dict[str, Tool] | list[Tool], config: AgentConfig, *,
                 tokenizer: Any = None, judge: Any = None, reward_fn: RewardFn | None = None):
        check_choices(config, "agent")
        check_ranges(config, "agent")  # a config built in code skipped the loader's check
        self.reward_fn = reward_fn or resolve_reward(config.reward_fn)
        if config.reward_fn == "judge" and judge is None:
            raise ValueError("agent.reward_fn=judge needs a judge (agent.judge.LLMJudge) passed to the agent")
        if config.context_policy == "keep_last_k" and config.keep_last_k < 1:
            raise ValueError("agent.keep_last_k must be at least 1")
        tools = dict(tools) if isinstance(tools, dict) else {t.name: t for t in tools}
        self.engine, self.tools, self.config, self.judge = engine, tools, config, judge
        self.tokenizer = tokenizer if tokenizer is not None else engine.tokenizer
        self.schemas: dict[str, dict[str, Any]] = {}
        for name, tool in self.tools.items():
            schema = dict(getattr(tool, "schema", None) or {})
            fn = dict(schema.get("function") or {"description": ""})
            fn["name"] = name  # the model calls a tool by its key in `tools`
            check_schema(name, fn.get("parameters") or {"type": "object"})
            self.schemas[name] = {**schema, "type": "function", "function": fn}
        engine_limit = getattr(engine, "max_model_len", None)  # an engine that reports its context length
        self.max_context = min(config.max_context_tokens, engine_limit) if isinstance(engine_limit, int) else config.max_context_tokens
        if self.max_context <= config.max_new_tokens:
            raise ValueError(f"agent.max_new_tokens={config.max_new_tokens} does not fit the context ({self.max_context} tokens)")
        self.fmt = make_format(config, self.schemas, self.tokenizer)
        self.policy = make_policy(config)
        eos = self.tokenizer.eos_token_id
        self.end_ids = {eos} if eos is not None else set()
        self._marker_ids: dict[str, list[int]] = {}

    def encode_marker(self, text: str) -> list[int]:
        """Tokenise harness text (chat markers, prefills); short strings are cached."""
        ids = self._marker_ids.get(text)
        if ids is None:
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            if len(text) <= 64:
                self._marker_ids[text] = ids
        return list(ids)

    def encode_content(self, text: str) -> list[int]:
        """Tokenise tool text; special-token strings in it (e.g. a page containing '<|im_end|>') stay text."""
        try:
            return self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
        except TypeError:  # tokenizers without the option
            return self.tokenizer.encode(text, add_special_tokens=False)

    async def run(self, question: Any, *, request_id: str | None = None, seed: int | None = None,
                  on_event: EventFn | None = None, group_id: str = "") -> Trajectory:
        return await _Episode(self, question, request_id, seed, on_event, group_id).run()


async def run_episode(question: Any, engine: InferenceEngine, tools: dict[str, Tool], config: AgentConfig, *,
                      tokenizer: Any = None, request_id: str | None = None, seed: int | None = None,
                      on_event: EventFn | None = None, judge: Any = None, group_id: str = "") -> Trajectory:
    """Play one episode (see module docstring). `question` is a QAItem (id, question, answers,
    aug_answers) or a plain string (no reward)."""
    agent = Agent(engine, tools, config, tokenizer=tokenizer, judge=judge)
    return await agent.run(question, request_id=request_id, seed=seed, on_event=on_event, group_id=group_id)


class _Episode:
    def __init__(self, agent: Agent, question: Any, request_id: str | None, seed: int | None,
                 on_event: EventFn | None, group_id: str):
        self.agent, self.cfg, self.fmt = agent, agent.config, agent.fmt
        self.qid, self.question, self.golds, self.aug = as_item(question)
        self.seed = seed
        self.forced_valid = random.Random(seed).random() < self.cfg.valid_inst_ratio
        self.request_id = request_id or uuid.uuid4().hex
        self.on_event = on_event
        self.ctx = TokenContext(agent.encode_marker, agent.encode_content)
        self.traj = Trajectory(self.qid, self.question, gold=self.golds, segments=self.ctx.segments, group_id=group_id)
        self.turn = self.acts = self.tool_calls_used = 0
        self.closed = ""  # text of the stop token (EOS) that ended the model's message; "" while it is open
        self.queue: list[Delivery] = []
        self.last_call_key, self.repeat_run = "", 0  # agent.max_repeated_calls
        self.call_counts: dict[str, int] = {}  # agent.max_call_revisits
        self.stop_reason: str | None = None
        self.extra: dict[str, Any] = {}
        meta = getattr(question, "meta", None) or {}
        bucket = question_bucket(meta)
        if bucket is not None:  # per-bucket accuracy and tool calls (trainer/batch.py, eval reports)
            self.extra["bucket"] = bucket
        min_searches = meta.get("min_searches")
        if isinstance(min_searches, int) and not isinstance(min_searches, bool) and min_searches > 0:
            self.extra["min_searches"] = min_searches  # agent.under_search_penalty reads it from traj.meta
        self.turn_log: list[dict[str, Any]] = []
        self.t0 = time.perf_counter()
        self.llm_s = self.tool_s = 0.0
        self.cost = 0.0  # dollars spent on tool calls
        self.generated_tokens = 0

    # --- helpers ----------------------------------------------------------------------------------
    def emit(self, event: str, **data: Any) -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(AgentEvent(event, self.turn, data, time.perf_counter() - self.t0))
        except Exception:  # a broken trace printer must not end the episode
            log.warning("on_event callback failed", exc_info=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def stop(self, reason: str, **info: Any) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            self.extra.update(info)
            self.emit("stop", reason=reason, **info)

    def budget_ok(self) -> bool:
        if self.turn >= self.cfg.max_turns:
            self.stop("max_turns")
        elif self.elapsed() >= self.cfg.wall_clock_s:
            self.stop("wall_clock")
        elif self.cfg.max_cost_usd > 0 and self.cost >= self.cfg.max_cost_usd:
            self.stop("max_cost", cost_usd=round(self.cost, 6))
        elif self.cfg.max_generated_tokens > 0 and self.generated_tokens >= self.cfg.max_generated_tokens:
            self.stop("max_tokens", generated_tokens=self.generated_tokens)
        return self.stop_reason is None

    def append(self, text: str, kind: str, **kw: Any) -> Block:
        """Tokenise new harness text on its own and append it (the only way text enters the context)."""
        self.emit("append", kind=kind, text=text)
        return self.ctx.add_text(text, kind, self.turn, **kw)

    def add_pieces(self, pieces: list[tuple[str, int | None]], deliveries: list[Delivery] | None = None) -> list[Block]:
        new = []
        for text, idx in pieces:
            if idx is None:
                self.append(text, "marker")
            else:
                d = deliveries[idx]  # type: ignore[index]
                new.append(self.append(text, "result", stub=self.fmt.wrap(d.stub), page=d.page))
        self.closed = ""
        return new

    def restub(self, blocks: list[Block]) -> None:
        if self.ctx.stub(blocks):
            self.emit("stub", results=len(blocks), segment=len(self.ctx.segments) - 1)

    def decode(self, comp) -> str:
        """The text of a completion without the stop token that ended the message (remembered in `closed`)."""
        ids = comp.output_ids
        ended = bool(ids) and (ids[-1] in self.agent.end_ids or (comp.finish_reason == "stop" and comp.stop_reason == ids[-1]))
        self.closed = self.agent.tokenizer.decode(ids[-1:], skip_special_tokens=False) if ended else ""
        return self.agent.tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=False)

    # --- the loop ---------------------------------------------------------------------------------
    async def run(self) -> Trajectory:
        try:
            self.start()
            while self.stop_reason is None:
                if self.queue and self.queue[0].read:
                    await self.read_turn()
                elif self.queue:
                    self.deliver_batch()
                else:
                    await self.act_turn()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("agent error in episode %s", self.qid)
            self.stop("agent_error", error=f"{type(e).__name__}: {e}")
        await self.finish()
        return self.traj

    def start(self) -> None:
        system: str | None = self.fmt.system_prompt(self.forced_valid)
        user = self.fmt.user_prompt(self.question)
        if self.cfg.prompt_layout == "user":
            system, user = None, f"{system}\n\n{user}"
        tools = list(self.agent.schemas.values()) if self.fmt.native_tools else None
        text = render_prompt(self.agent.tokenizer, system, user, tools)
        self.emit("append", kind="prompt", text=text)
        self.ctx.add(Block(self.agent.encode_marker(text), -1, "prompt"))
        self.emit("start", question=self.question, forced_valid=self.forced_valid, prompt_tokens=len(self.ctx),
                  request_id=self.request_id)

    def prefill_for_act(self) -> str:
        mode = "tags" if self.cfg.prefill_tags else self.cfg.prefill
        if mode in ("tags", "answer") and self.tool_calls_used >= self.cfg.max_tool_calls:
            return "<answer>"
        if mode == "tags" and self.acts == 0:
            return self.fmt.prefill_first()
        return "<think>\n" if mode == "think" else ""

    async def llm(self, stops: list[str], kind: str):
        cfg, ctx, limit = self.cfg, self.ctx, self.agent.max_context
        if len(ctx) + cfg.max_new_tokens > limit and self.agent.policy.compacts and cfg.compact_to > 0:
            target = int(cfg.compact_to * limit)
            if ctx.drop_oldest(target, self.turn, lambda n: f"[{n} earlier steps were removed to save space]\n\n"):
                self.emit("compact", dropped=ctx.dropped_turns, tokens=len(ctx))
        if len(ctx) + cfg.max_new_tokens > limit:
            self.stop("max_context", context_tokens=len(ctx))
            return None
        seed = None if self.seed is None else (self.seed * 1_000_003 + self.turn) % (2**31)
        sp = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, max_new_tokens=cfg.max_new_tokens,
                            stop=list(stops), seed=seed)
        request = GenerateRequest(prompt_ids=ctx.ids, sampling=sp, request_id=self.request_id)
        t = time.perf_counter()
        try:
            comp = await asyncio.wait_for(generate_continuing(self.agent.engine, request),
                                          max(cfg.wall_clock_s - self.elapsed(), 1e-3))
        except asyncio.TimeoutError:
            self.stop("wall_clock")
            return None
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.stop("engine_error", error=f"{type(e).__name__}: {e}"[:500])
            return None
        finally:
            self.llm_s += time.perf_counter() - t
        prompt_tokens = len(ctx)
        self.generated_tokens += len(comp.output_ids)
        ctx.add(Block(list(comp.output_ids), self.turn, "gen", list(comp.logprobs), list(comp.versions)))
        self.turn_log.append({"turn": self.turn, "kind": kind, "prompt_tokens": prompt_tokens,
                              "new_tokens": len(comp.output_ids), "finish": comp.finish_reason,
                              "segment": len(ctx.segments) - 1, "llm_s": round(time.perf_counter() - t, 6)})
        self.turn += 1
        if comp.finish_reason == "abort":
            self.stop("engine_abort")
            return None
        return comp

    async def act_turn(self) -> None:
        if not self.budget_ok():
            return
        if self.closed:  # the model ended its message after a read turn: invite the next action
            self.add_pieces(self.fmt.message(CONTINUE_NUDGE, self.closed))
        prefill = self.prefill_for_act()
        if prefill:
            self.append(prefill, "prefill")
        comp = await self.llm(self.fmt.act_stops, "act")
        if comp is None:
            return
        self.acts += 1
        text = prefill + self.decode(comp)
        self.emit("llm", kind="act", text=text, finish=comp.finish_reason, new_tokens=len(comp.output_ids))
        try:
            parsed = self.fmt.parse(text)
        except Exception as e:  # the parser is fuzzed never to raise; this is the last line of defence
            log.exception("parser raised")
            self.format_error([f"unparseable output ({type(e).__name__})"])
            return
        for thought in parsed.thoughts:
            self.emit("thought", text=thought)
        if not parsed.ok:
            self.format_error(parsed.errors)
        elif parsed.answer is not None:
            self.traj.prediction = parsed.answer
            self.emit("answer", text=parsed.answer)
            self.stop("answered")
        else:
            await self.run_tools(parsed.calls)

    async def run_tools(self, calls) -> None:
        left = self.cfg.max_tool_calls - self.tool_calls_used
        if left <= 0:
            self.stop("max_tool_calls")
            return
        if self.repeats_too_often(calls):
            return
        run, skipped = calls[:left], calls[left:]
        self.tool_calls_used += len(run)
        for call in run:
            self.emit("tool_call", name=call.name, args=call.args)
        t = time.perf_counter()
        remaining = max(self.cfg.wall_clock_s - self.elapsed(), 1e-3)
        results = await asyncio.gather(*(call_tool(self.agent.tools.get(call.name), call, remaining) for call in run))
        self.tool_s += time.perf_counter() - t
        self.cost += sum(float(obs.cost or 0.0) for obs in results)
        for call, obs in zip(run, results, strict=True):
            rec, deliveries = deliveries_for(call, obs, self.turn - 1, self.cfg)
            self.traj.tool_calls.append(rec)
            self.emit("tool_result", name=call.name, summary=rec.summary, error=rec.error, latency_s=rec.latency_s,
                      cached=rec.cached, parts=len(deliveries))
            self.queue.extend(deliveries)
        for call in skipped:
            self.queue.append(Delivery(f"Not run: the episode's tool-call budget is spent ({call.name}).", "", False))

    def repeats_too_often(self, calls) -> bool:
        """`agent.max_repeated_calls`: the same call that many times in a row closes the tool budget;
        `agent.max_call_revisits`: the same call that many times in the episode, in a row or not."""
        in_a_row, in_all = self.cfg.max_repeated_calls, self.cfg.max_call_revisits
        if not (in_a_row or in_all) or not calls:
            return False
        key = repr([call_key(c.name, c.args) for c in calls])
        self.repeat_run = self.repeat_run + 1 if key == self.last_call_key else 1
        self.last_call_key = key
        self.call_counts[key] = times = self.call_counts.get(key, 0) + 1
        if in_a_row and self.repeat_run >= in_a_row:
            count, why = self.repeat_run, f"the same call {self.repeat_run} times in a row"
        elif in_all and times >= in_all:
            count, why = times, f"the same call {times} times in this episode"
        else:
            return False
        self.tool_calls_used = self.cfg.max_tool_calls
        self.extra["repeated_call"] = True
        self.emit("repeated_call", times=count)  # the count of the rule that closed the budget
        self.queue.append(Delivery(f"Not run: {why}; the tool budget is closed, answer now.", "", False))
        return True

    def deliver_batch(self) -> None:
        batch: list[Delivery] = []
        while self.queue and not self.queue[0].read:
            batch.append(self.queue.pop(0))
        new = self.add_pieces(self.fmt.results([d.text for d in batch], self.closed), batch)
        self.restub(self.agent.policy.after_results(self.ctx, new))

    async def read_turn(self) -> None:
        if not self.budget_ok():
            return
        d = self.queue.pop(0)
        new = self.add_pieces(self.fmt.results([d.text], self.closed), [d])
        self.restub(self.agent.policy.after_results(self.ctx, new))
        self.append(self.fmt.read_prefill, "prefill")
        comp = await self.llm(self.fmt.read_stops, "read")
        if comp is None:
            return
        text = self.decode(comp)
        self.emit("llm", kind="read", text=text, finish=comp.finish_reason, new_tokens=len(comp.output_ids))
        notes, errors = parse_read(self.fmt.read_prefill + text)
        self.emit("notes", text=notes)
        if "</think>" not in text and not self.closed:  # notes cut by the token cap: close them for the model
            self.append("\n</think>\n", "marker")
        if errors:
            self.format_error(errors)
        self.restub(self.agent.policy.after_read(self.ctx, new[0]))

    def format_error(self, errors: list[str]) -> None:
        self.traj.format_errors += 1
        self.emit("format_error", errors=errors)
        if self.cfg.max_format_errors and self.traj.format_errors >= self.cfg.max_format_errors:
            self.stop("format_errors")
            return
        message = FORMAT_ERROR.format(errors="; ".join(errors), hint=self.fmt.hint())
        self.add_pieces(self.fmt.message(message, self.closed))

    async def finish(self) -> None:
        traj = self.traj
        traj.stop_reason = self.stop_reason or "agent_error"
        traj.num_turns = self.turn
        traj.segments = [s for s in traj.segments if s.num_generated]  # segments without policy tokens teach nothing
        if traj.segments:
            trim_tail(traj.segments[-1])
        traj.meta = {"request_id": self.request_id, "seed": self.seed, "forced_valid": self.forced_valid,
                     "action_format": self.cfg.action_format, "context_policy": self.cfg.context_policy,
                     "dropped_turns": self.ctx.dropped_turns, "turns": self.turn_log,
                     "generated_tokens": self.generated_tokens, "cost_usd": self.cost, **self.extra}
        try:
            traj.reward, traj.reward_info = await score_episode(traj, self.golds, self.aug, self.cfg, self.forced_valid,
                                                                self.agent.judge, self.agent.reward_fn)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # e.g. the judge's engine failed: keep the trajectory, say why
            log.warning("reward failed for %s: %s", self.qid, e)
            traj.reward, traj.reward_info = 0.0, {"error": f"{type(e).__name__}: {e}"[:300]}
        traj.timings = {"total": self.elapsed(), "llm": self.llm_s, "tools": self.tool_s}
