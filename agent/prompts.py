"""Prompt texts and chat-turn markers.

The instructions are ours, written for the action formats of `agent.parser`; questions from
ASearcher's released data (a `question` string) drop in unchanged. The chat template is rendered
once per episode for the system + user prompt. Everything appended later (tool results, new user
or tool turns) uses *markers*: the exact text the model's chat template puts around a message,
found once per tokenizer by rendering a tiny probe conversation and cutting it at sentinel
strings. So a Qwen template that folds tool results into a user turn inside <tool_response> tags,
and a plain ChatML template with a `tool` role, are both followed exactly, without ever
re-rendering the template over the history.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

SEARCH_INSTRUCTIONS = """\
You answer questions by searching for evidence. At each step you may think inside <think> </think>, \
then take exactly one action:
{actions}
Results are shown inside <information> </information>. After each result, write what you learned \
inside <think> </think>: long page text is removed later, your notes stay.
{validity}"""

ACTION_LINES = {
    "search": "- <search> query </search>: {what}",
    "access": "- <access> url </access> opens a page from the results; long pages arrive one part at a time.",
    "answer": "- <answer> answer </answer> ends with your final answer: short, e.g. a name, a number or a date.",
}

TOOL_CALL_INSTRUCTIONS = """\
You answer questions by calling tools and reasoning over their results. Think inside <think> </think>.
{tools}To call a tool, write
<tool_call>
{{"name": "<tool name>", "arguments": {{<arguments as a JSON object>}}}}
</tool_call>
(one block per call, several calls allowed) and end your turn; results come back in the next turn. \
When you know the answer, write <answer> answer </answer>: short, e.g. a name, a number or a date.
{validity}"""

FORCED_VALID = "Every question has an answer; if you are unsure, give the most likely one."
MAY_BE_INVALID = "If the question cannot be answered as asked, reply <answer> the question is invalid. </answer>"

FORMAT_ERROR = "Format error: {errors}. {hint}"
CONTINUE_NUDGE = "Continue with your next action."

# A worked example in the offline world's style (a fictional city; no real-world knowledge helps).
EXAMPLE_QUESTION = "In what year was the city of Varnholt founded?"
EXAMPLE_QUERY = "Varnholt founded"
EXAMPLE_RESULT = "Varnholt is a city in the province of Qesmir. It was founded in 1642 by Dalia Orrent."
EXAMPLE_NOTE = "Varnholt was founded in 1642."
EXAMPLE_ANSWER = "1642"


def tools_block(schemas: dict[str, dict[str, Any]]) -> str:
    """Function schemas, one JSON object per line, inside <tools> tags."""
    lines = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas.values())
    return f"Tools (OpenAI function schemas):\n<tools>\n{lines}\n</tools>\n"


@dataclass(frozen=True)
class ChatMarkers:
    """Text the chat template puts around messages (see module docstring)."""

    assistant_end: str
    """Closes an assistant message, e.g. '<|im_end|>\\n'."""
    user_open: str
    """After a closed assistant message: opens a user message."""
    user_close: str
    """Closes a user message and opens the assistant's reply."""
    tool_open: str
    """After a closed assistant message: opens the first tool result."""
    tool_between: str
    """Between two consecutive tool results."""
    tool_close: str
    """After the last tool result: closes it and opens the assistant's reply."""
    eos_text: str = ""
    """Text of the EOS token that ends an assistant message when the model emits it."""

    def end_rest(self, closed_by: str = "") -> str:
        """What still has to be written to close the assistant message, given the text of the stop
        token the model ended it with ("" when it did not end it: a stop string or the token cap)."""
        if closed_by and self.assistant_end.startswith(closed_by):
            return self.assistant_end[len(closed_by):]
        return self.assistant_end


_SENT = {k: f"\u2063{k}\u2063" for k in ("SYS", "USR", "AST", "T1", "T2", "U2")}
_MARKER_CACHE: dict[int, tuple[Any, ChatMarkers]] = {}


def _render(tokenizer: Any, messages: list[dict[str, str]], gen: bool) -> str:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False)


def _probe(tokenizer: Any, tool_role: str) -> ChatMarkers:
    s = _SENT
    base = [{"role": "system", "content": s["SYS"]}, {"role": "user", "content": s["USR"]},
            {"role": "assistant", "content": s["AST"]}]
    end = _render(tokenizer, base, False).split(s["AST"], 1)[1]
    user_part = _render(tokenizer, base + [{"role": "user", "content": s["U2"]}], True).split(s["AST"], 1)[1]
    u_open, u_close = user_part.split(s["U2"], 1)
    tools = base + [{"role": tool_role, "content": s["T1"]}, {"role": tool_role, "content": s["T2"]}]
    tool_part = _render(tokenizer, tools, True).split(s["AST"], 1)[1]
    t_open, rest = tool_part.split(s["T1"], 1)
    t_between, t_close = rest.split(s["T2"], 1)
    if not (u_open.startswith(end) and t_open.startswith(end)):
        raise ValueError("template does not close assistant messages consistently")
    eos = getattr(tokenizer, "eos_token", None) or ""
    return ChatMarkers(end, u_open[len(end):], u_close, t_open[len(end):], t_between, t_close, eos)


def chat_markers(tokenizer: Any) -> ChatMarkers:
    """The markers of a tokenizer's chat template (cached per tokenizer object)."""
    hit = _MARKER_CACHE.get(id(tokenizer))
    if hit is not None and hit[0] is tokenizer:
        return hit[1]
    markers = None
    if getattr(tokenizer, "chat_template", None):
        for role in ("tool", "user"):
            try:
                markers = _probe(tokenizer, role)
                break
            except Exception:  # templates that reject a role or drop sentinels: try the next option
                continue
    if markers is None:  # no usable template: a plain transcript
        eos = getattr(tokenizer, "eos_token", None) or ""
        markers = ChatMarkers(eos + "\n", "User: ", "\nAssistant: ", "Tool: ", "\nTool: ", "\nAssistant: ", eos)
    _MARKER_CACHE[id(tokenizer)] = (tokenizer, markers)
    return markers


def render_prompt(tokenizer: Any, system: str | None, user: str, tools: list[dict[str, Any]] | None = None) -> str:
    """The initial prompt text: system (None: none) + user message and the assistant's generation prompt."""
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": user}]
    if not getattr(tokenizer, "chat_template", None):
        return f"{system or ''}\n\nUser: {user}\nAssistant: ".lstrip()
    if tools:
        return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return _render(tokenizer, messages, True)


_NATIVE_CACHE: dict[tuple[int, str], tuple[Any, bool]] = {}


def renders_tools_natively(tokenizer: Any, schemas: list[dict[str, Any]]) -> bool:
    """True when the chat template itself writes the tool schemas into the prompt (Qwen, Hermes, ...)."""
    if not schemas or not getattr(tokenizer, "chat_template", None):
        return False
    name = schemas[0].get("function", {}).get("name", "")
    key = (id(tokenizer), name)
    hit = _NATIVE_CACHE.get(key)
    if hit is not None and hit[0] is tokenizer:
        return hit[1]
    try:
        with_tools = render_prompt(tokenizer, "S", "U", schemas)
        native = bool(name) and name in with_tools and with_tools != render_prompt(tokenizer, "S", "U")
    except Exception:
        native = False
    _NATIVE_CACHE[key] = (tokenizer, native)
    return native
