"""One episode's calls to the recording OpenAI endpoint, and the token-exact trajectory they make.

An agent program talks chat messages; the learner needs the token ids the engine saw and sampled.
`EpisodeCalls` turns each chat request into the prompt ids that are actually sent to the engine and
records every completion (ids, behaviour log-probs, weight versions) with them, so a trajectory built
from the records is exactly what was sampled, never a re-tokenisation of text.

Prompts (`EpisodeCalls.chat_prompt`), against the previous chat call of the episode:

    extends       the rendered prompt's ids start with the previous prompt + completion ids: sent as rendered
    retokenized   the messages extend the previous ones plus the reply we returned, but re-rendering changed
                  earlier tokens (a tool call re-serialised with other spacing, a BPE merge across the
                  boundary): the previous ids are kept as sampled and only the new messages' text (cut from
                  the template's rendering) is tokenised and appended. Counted; never trained as text the
                  model did not write
    new           anything else (the agent dropped or summarised history): rendered and sent as is; it starts
                  a new segment of the trajectory (`build_segments`), counted as a split

Tools. When the chat template renders `tools` itself (Qwen, Hermes, ...) they are passed to it; otherwise a
Hermes instruction with the schemas is appended to the system message, assistant tool calls are written
back as `<tool_call>` blocks and tool results wrapped in `<tool_response>`. Model output is parsed for
Hermes `<tool_call>{"name", "arguments"}</tool_call>` blocks into OpenAI `tool_calls`.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from agent.parser import scan_tags
from agent.prompts import chat_markers, renders_tools_natively, tools_block
from agent.trajectory import Segment

TOOL_CALL_HINT = ('To call a tool, write <tool_call>\n{"name": "<tool name>", "arguments": {<arguments>}}\n'
                  "</tool_call> (one block per call) and end your turn; results come back in the next turn.")


def text_of(content: Any) -> str:
    """The text of a message `content`: a string, a list of parts (their `text`), or None ("")."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _arguments(raw: Any) -> Any:
    """Tool-call arguments as an object when they are JSON (OpenAI sends a string), else as given."""
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}
        except ValueError:
            return raw
    return raw


def normalize_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages reduced to what a chat template renders (role, text, tool calls by name and arguments), so a
    history the agent sends back compares equal to the one it was sent, whatever ids or spacing it used."""
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"messages[{i}] must be an object with a 'role'")
        norm: dict[str, Any] = {"role": m["role"], "content": text_of(m.get("content"))}
        calls = m.get("tool_calls") or []
        if calls:
            norm["tool_calls"] = [{"name": (c.get("function") or {}).get("name", ""),
                                   "arguments": _arguments((c.get("function") or {}).get("arguments"))}
                                  for c in calls if isinstance(c, dict)]
        out.append(norm)
    return out


def _hermes_call(call: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": call["name"], "arguments": call["arguments"]}) + "\n</tool_call>"


class ChatRenderer:
    """Renders normalised messages with a tokenizer's chat template (see the module docstring)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.markers = chat_markers(tokenizer)
        self._tool_role = "tool"

    def native(self, tools: list[dict[str, Any]] | None) -> bool:
        return bool(tools) and renders_tools_natively(self.tokenizer, tools)

    def template_messages(self, norm: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict]:
        native = self.native(tools)
        out: list[dict[str, Any]] = []
        for m in norm:
            m = dict(m)
            calls = m.pop("tool_calls", None)
            if calls and native:
                m["tool_calls"] = [{"type": "function", "function": c} for c in calls]
            elif calls:
                m["content"] = "\n".join(([m["content"]] if m["content"] else []) + [_hermes_call(c) for c in calls])
            if m["role"] == "tool" and not native:
                m = {"role": self._tool_role, "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
            out.append(m)
        if tools and not native:
            block = tools_block({str(i): t for i, t in enumerate(tools)}) + TOOL_CALL_HINT
            if out and out[0]["role"] == "system":
                out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + block}
            else:
                out.insert(0, {"role": "system", "content": block})
        return out

    def render(self, norm: list[dict[str, Any]], tools: list[dict[str, Any]] | None, gen: bool = True) -> str:
        if not getattr(self.tokenizer, "chat_template", None):  # a base model: a plain transcript
            text = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in self.template_messages(norm, tools))
            return text + ("Assistant: " if gen else "")
        kwargs = {"tools": tools} if self.native(tools) else {}
        try:
            return self.tokenizer.apply_chat_template(self.template_messages(norm, tools), add_generation_prompt=gen,
                                                      tokenize=False, **kwargs)
        except Exception:
            if self._tool_role == "tool" and any(m["role"] == "tool" for m in norm):
                self._tool_role = "user"  # a template without a tool role: results go in user turns
                return self.render(norm, tools, gen)
            raise

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)


def tool_choice_prefill(tool_choice: Any, tools: list[dict[str, Any]] | None) -> str:
    """Text written for the model after the generation prompt: a forced tool call's opening."""
    if not tools or tool_choice in (None, "auto", "none"):
        return ""
    if tool_choice == "required":
        return "<tool_call>\n"
    name = (tool_choice.get("function") or {}).get("name") if isinstance(tool_choice, dict) else None
    if not isinstance(name, str) or not name:
        raise ValueError(f"tool_choice must be 'none', 'auto', 'required' or a named function, got {tool_choice!r}")
    return '<tool_call>\n{"name": ' + json.dumps(name) + ', "arguments": '


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, OpenAI tool_calls) of model output: every `<tool_call>` block must be a JSON object with a
    `name`, else the whole text is the content and there are no tool calls (as vLLM's Hermes parser does)."""
    if "<tool_call>" not in text:
        return text, []
    pairs, errors = scan_tags(text, ("tool_call",), lenient=True, closable=("tool_call",))
    calls = []
    for _, body in pairs:
        try:
            obj = json.loads(body.strip())
        except ValueError:
            return text, []
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return text, []
        args = obj.get("arguments", obj.get("parameters", {}))
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": obj["name"],
                                   "arguments": args if isinstance(args, str) else json.dumps(args)}})
    if errors or not calls:
        return text, []
    rest = text.split("<tool_call>", 1)[0].strip()
    return rest or None, calls


@dataclass
class CallRecord:
    """One engine call of the episode, as sent and as sampled."""

    route: str
    """`chat` or `completions`."""
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str
    how: str = "new"
    """How the prompt was built: first, extends, retokenized, new (see the module docstring)."""
    latency_s: float = 0.0


def build_segments(calls: list[CallRecord]) -> tuple[list[Segment], int]:
    """(segments, splits): a call whose prompt extends a segment's tokens continues it (the newest such
    segment), any other call starts a new one; splits counts the segments after the first."""
    segments: list[Segment] = []
    for call in calls:
        seg = next((s for s in reversed(segments)
                    if len(call.prompt_ids) >= len(s) and call.prompt_ids[:len(s)] == s.token_ids), None)
        if seg is None:
            seg = Segment()
            segments.append(seg)
        seg.append_prompt(call.prompt_ids[len(seg):])
        seg.append_generated(list(call.output_ids), list(call.logprobs), list(call.versions))
    return segments, max(0, len(segments) - 1)


@dataclass
class EpisodeCalls:
    """What one episode sent and received; its key on the endpoint selects it (see agent/openai_endpoint.py)."""

    engine: Any
    request_id: str
    seed: int | None
    sampling: dict[str, Any]
    """temperature, top_p, top_k of the run (the program's own settings are not the behaviour policy)."""
    max_new_tokens: int
    max_context_tokens: int
    max_calls: int
    calls: list[CallRecord] = field(default_factory=list)
    tool_calls: list[tuple[int, str, Any]] = field(default_factory=list)
    """(call index, tool name, arguments) of every tool call the model made."""
    budget_spent: bool = False
    engine_error: str = ""
    started: int = 0
    _last_chat: tuple[list[dict[str, Any]], list[int], str] | None = None

    def chat_prompt(self, renderer: ChatRenderer, norm: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    prefill: str) -> tuple[list[int], str]:
        """(prompt ids to send, how they were built); see the module docstring."""
        full = renderer.render(norm, tools)
        ids = renderer.encode(full + prefill)
        last = self._last_chat
        if last is None:
            return ids, "first"
        prev_msgs, prev_ids, closed = last
        if ids[:len(prev_ids)] == prev_ids:
            return ids, "extends"
        if len(norm) > len(prev_msgs) and norm[:len(prev_msgs)] == prev_msgs:
            head = renderer.render(prev_msgs, tools, gen=False)
            if full.startswith(head):
                tail = renderer.markers.end_rest(closed)
                return prev_ids + renderer.encode(tail) + renderer.encode(full[len(head):] + prefill), "retokenized"
        return ids, "new"

    def remember_chat(self, norm: list[dict[str, Any]], reply: dict[str, Any], ids: list[int], closed: str) -> None:
        """The history the next chat call is expected to extend: these messages plus our reply."""
        self._last_chat = (norm + normalize_messages([reply]), ids, closed)
