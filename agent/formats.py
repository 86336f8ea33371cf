"""Action formats: how instructions, tool results and harness text look for each format.

A format decides the system prompt, the stop strings of act and read turns, how a turn is parsed,
and the *pieces* of text the harness appends: a list of (text, index) where index names the tool
result a piece carries (None for markers). Pieces are tokenised one by one, so a context policy can
later swap one result for its stub without touching the tokens around it.

- `asearcher`: the whole episode is one assistant message; results are written inline inside
  `<information>` blocks right after the action's closing tag (ASearcher's layout). Only when the
  model ends its message (EOS) does the next text go into a new user message.
- `hermes`: each act turn is an assistant message ending in EOS; results come back as tool
  messages exactly as the model's chat template renders them (see `agent.prompts.ChatMarkers`).
"""

from __future__ import annotations

from typing import Any

from agent import prompts as P
from agent.config import AgentConfig
from agent.parser import ParsedTurn, check_tool_name, first_string_param, parse_asearcher, parse_hermes

Piece = tuple[str, "int | None"]


class ActionFormat:
    """Base class; see the module docstring."""

    name = ""
    act_stops: list[str] = []
    read_stops = ["</think>"]
    read_prefill = "<think>\n"

    def __init__(self, config: AgentConfig, schemas: dict[str, dict[str, Any]], markers: P.ChatMarkers,
                 native_tools: bool = False):
        self.config = config
        self.schemas = schemas
        self.markers = markers
        self.native_tools = native_tools
        self.forbidden = tuple(m for m in ("<|im_start|>", "<|start_header_id|>") if m in
                               markers.user_open + markers.tool_open + markers.tool_close)

    # --- prompts ---
    def system_prompt(self, forced_valid: bool) -> str:
        raise NotImplementedError

    def user_prompt(self, question: str) -> str:
        return f"Question: {question}"

    def example(self) -> str:
        raise NotImplementedError

    def _with_example(self, text: str) -> str:
        if not self.config.worked_example:
            return text
        example = self.config.worked_example_text or self.example()
        return f"{text}\n\nExample:\n{example}"

    # --- parsing ---
    def parse(self, text: str) -> ParsedTurn:
        raise NotImplementedError

    def hint(self) -> str:
        raise NotImplementedError

    def prefill_first(self) -> str:
        """Opening tag written at the first act turn under `prefill=tags`."""
        raise NotImplementedError

    # --- harness text ---
    def wrap(self, text: str) -> str:
        """One tool result as the model sees it."""
        raise NotImplementedError

    def results(self, texts: list[str], closed: str) -> list[Piece]:
        """Pieces that deliver tool results (piece i carries result i). `closed` is the text of the stop
        token that ended the model's message ("" while the message is open)."""
        raise NotImplementedError

    def message(self, text: str, closed: str) -> list[Piece]:
        """Pieces that show the model a harness message (a format error, a nudge)."""
        m = self.markers
        return [(m.end_rest(closed) + m.user_open + text + m.user_close, None)]


class AsearcherFormat(ActionFormat):
    name = "asearcher"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        for tool in self.schemas:
            check_tool_name(tool)
        self.act_stops = [f"</{t}>" for t in self.schemas] + ["</answer>"]

    def system_prompt(self, forced_valid: bool) -> str:
        base = self.config.system_prompt
        if not base:
            lines = [self._action_line(name, schema) for name, schema in self.schemas.items()]
            lines.append(P.ACTION_LINES["answer"])
            base = P.SEARCH_INSTRUCTIONS.format(actions="\n".join(lines),
                                                validity=P.FORCED_VALID if forced_valid else P.MAY_BE_INVALID)
        return self._with_example(base)

    @staticmethod
    def _action_line(name: str, schema: dict[str, Any]) -> str:
        what = " ".join(((schema.get("function") or {}).get("description") or "").split())
        if name == "search":
            return P.ACTION_LINES["search"].format(what=what or "search the web.")
        if name == "access":
            return P.ACTION_LINES["access"]
        props = ((schema.get("function") or {}).get("parameters") or {}).get("properties") or {}
        arg = "JSON arguments" if len(props) > 1 else (first_string_param(schema) or "input")
        return f"- <{name}> {arg} </{name}>: {what or 'calls the ' + name + ' tool.'}"

    def example(self) -> str:
        note = f"\n<think>{P.EXAMPLE_NOTE}</think>" if self.config.read_search_results else ""
        return (f"Question: {P.EXAMPLE_QUESTION}\n<search>{P.EXAMPLE_QUERY}</search>\n"
                f"{self.wrap(P.EXAMPLE_RESULT)}{note}\n<answer>{P.EXAMPLE_ANSWER}</answer>")

    def parse(self, text: str) -> ParsedTurn:
        c = self.config
        return parse_asearcher(text, self.schemas, lenient=c.lenient_tags, max_calls=c.max_calls_per_turn,
                               forbidden=self.forbidden)

    def hint(self) -> str:
        tags = [f"<{t}> … </{t}>" for t in self.schemas]
        return "Write one action: " + ", ".join([*tags, "<answer> … </answer>"]) + "."

    def prefill_first(self) -> str:
        first = "search" if "search" in self.schemas else next(iter(self.schemas), "")
        return f"<{first}>" if first else ""

    def wrap(self, text: str) -> str:
        return f"<information>\n{text}\n</information>"

    def results(self, texts: list[str], closed: str) -> list[Piece]:
        m = self.markers
        if closed:
            pieces: list[Piece] = [(m.end_rest(closed) + m.user_open, None)]
            sep, tail = "\n", m.user_close
        else:
            pieces, sep, tail = [("\n\n", None)], "\n\n", "\n\n"
        for i, t in enumerate(texts):
            if i:
                pieces.append((sep, None))
            pieces.append((self.wrap(t), i))
        pieces.append((tail, None))
        return pieces

    def message(self, text: str, closed: str) -> list[Piece]:
        if closed:
            return super().message(text, closed)
        return [("\n\n" + self.wrap(text) + "\n\n", None)]


class HermesFormat(ActionFormat):
    name = "hermes"
    # A turn of tool calls ends with EOS (it may hold several); an answer ends the turn at once: text
    # generated after `</answer>` is a format error, and would be trained on.
    act_stops = ["</answer>"]

    def system_prompt(self, forced_valid: bool) -> str:
        validity = P.FORCED_VALID if forced_valid else P.MAY_BE_INVALID
        base = self.config.system_prompt or P.TOOL_CALL_INSTRUCTIONS.format(
            tools="" if self.native_tools else P.tools_block(self.schemas), validity=validity)
        return self._with_example(base)

    def example(self) -> str:
        name = "search" if "search" in self.schemas else next(iter(self.schemas), "search")
        key = first_string_param(self.schemas.get(name, {})) or "query"
        call = f'{{"name": "{name}", "arguments": {{"{key}": "{P.EXAMPLE_QUERY}"}}}}'
        return (f"Question: {P.EXAMPLE_QUESTION}\n<tool_call>\n{call}\n</tool_call>\n"
                f"<tool_response>\n{P.EXAMPLE_RESULT}\n</tool_response>\n<answer>{P.EXAMPLE_ANSWER}</answer>")

    def parse(self, text: str) -> ParsedTurn:
        c = self.config
        return parse_hermes(text, self.schemas, lenient=c.lenient_tags, max_calls=c.max_calls_per_turn,
                            forbidden=self.forbidden)

    def hint(self) -> str:
        return 'Call a tool with <tool_call>{"name": …, "arguments": {…}}</tool_call> or answer with <answer> … </answer>.'

    def prefill_first(self) -> str:
        return "<tool_call>\n"

    def wrap(self, text: str) -> str:
        if "<tool_response>" in self.markers.tool_open:
            return text
        return f"<tool_response>\n{text}\n</tool_response>"

    def results(self, texts: list[str], closed: str) -> list[Piece]:
        m = self.markers
        pieces: list[Piece] = [(m.end_rest(closed) + m.tool_open, None)]
        for i, t in enumerate(texts):
            if i:
                pieces.append((m.tool_between, None))
            pieces.append((self.wrap(t), i))
        pieces.append((m.tool_close, None))
        return pieces


FORMATS: dict[str, type[ActionFormat]] = {f.name: f for f in (AsearcherFormat, HermesFormat)}
"""Action formats by `agent.action_format` (a Literal of the config: adding one means adding it there)."""


def make_format(config: AgentConfig, schemas: dict[str, dict[str, Any]], tokenizer: Any) -> ActionFormat:
    """The configured action format, bound to the tokenizer's chat markers."""
    if config.action_format not in FORMATS:
        raise ValueError(f"unknown agent.action_format '{config.action_format}'; valid: {', '.join(FORMATS)}")
    native = config.action_format == "hermes" and P.renders_tools_natively(tokenizer, list(schemas.values()))
    return FORMATS[config.action_format](config, schemas, P.chat_markers(tokenizer), native)
