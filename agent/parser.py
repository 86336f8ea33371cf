"""Action parsing: any model output becomes actions or format errors, never an exception.

Two formats share one tag scanner:

- `asearcher`: `<think>…</think>`, `<search>query</search>`, `<access>url</access>`,
  `<answer>…</answer>`. Every configured tool has its tag (a tool `calculator` gives
  `<calculator>…</calculator>`): `<X>text</X>` calls tool `X` with its first required string
  argument set to the text, or, for a tool with several parameters, with the text as a JSON object
  of arguments when it is one.
- `hermes`: `<tool_call>{"name": …, "arguments": {…}}</tool_call>` (arguments may also be a JSON
  string), checked against the tool's OpenAI function schema; `<think>` and `<answer>` as above.

Rules (each violation is one line in `ParsedTurn.errors`, shown to the model and counted by the
reward's format gate): tags are balanced and do not nest; the model never writes `<information>`
(tool results come from the harness) nor a chat-turn marker; a turn holds tool calls or one answer,
not both, and at most `max_calls` calls; an empty query or an unknown tool is an error; a turn with
no action is an error. With `lenient`, a final action tag left open because the turn ended counts
as closed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from tools.protocol import check_tool_name as valid_tool_name

ASEARCHER_TAGS = ("think", "search", "access", "answer", "information")
"""Tags of the ASearcher format with its two built-in tools; configured tools add their own."""
HERMES_TAGS = ("think", "answer", "information", "tool_call")
RESERVED_TAGS = ("think", "answer", "information", "tool_call")
_TAG_RES: dict[tuple[str, ...], re.Pattern[str]] = {}


def check_tool_name(name: str) -> None:
    """Raise ValueError unless `name` can be a tool name and an action tag (not one of the format's own)."""
    valid_tool_name(name)
    if name in RESERVED_TAGS:
        raise ValueError(f"tool name {name!r} is reserved by the action format ({', '.join(RESERVED_TAGS)})")


@dataclass
class ToolCall:
    """One tool call the model asked for."""

    name: str
    args: dict[str, Any]


@dataclass
class ParsedTurn:
    """What one LLM turn asked for."""

    calls: list[ToolCall] = field(default_factory=list)
    answer: str | None = None
    thoughts: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def _tag_re(tags: tuple[str, ...]) -> re.Pattern[str]:
    if tags not in _TAG_RES:
        _TAG_RES[tags] = re.compile(r"<(/?)(" + "|".join(map(re.escape, tags)) + r")>")
    return _TAG_RES[tags]


def scan_tags(text: str, tags: tuple[str, ...], *, lenient: bool = False,
              closable: tuple[str, ...] = ()) -> tuple[list[tuple[str, str]], list[str]]:
    """Balanced, non-nested (tag, content) pairs in order, plus errors for everything else."""
    pairs: list[tuple[str, str]] = []
    errors: list[str] = []
    open_tag: str | None = None
    start = 0
    for m in _tag_re(tags).finditer(text):
        closing, name = m.group(1) == "/", m.group(2)
        if not closing:
            if open_tag is not None:
                errors.append(f"<{name}> opened inside <{open_tag}>; tags must not nest")
                continue
            open_tag, start = name, m.end()
        elif open_tag == name:
            pairs.append((name, text[start:m.start()]))
            open_tag = None
        else:
            errors.append(f"</{name}> without a matching <{name}>")
    if open_tag is not None:
        if lenient and open_tag in closable:
            pairs.append((open_tag, text[start:]))
        else:
            errors.append(f"<{open_tag}> is never closed")
    return pairs, errors


def first_string_param(schema: dict[str, Any]) -> str | None:
    """The argument a tag's text fills: the first required string parameter (else the first string one)."""
    params = (schema.get("function") or {}).get("parameters") or {}
    props = params.get("properties") or {}
    required = [p for p in params.get("required") or [] if (props.get(p) or {}).get("type", "string") == "string"]
    if required:
        return required[0]
    strings = [p for p, spec in props.items() if isinstance(spec, dict) and spec.get("type") == "string"]
    return strings[0] if strings else None


def _common_checks(text: str, pairs: list[tuple[str, str]], forbidden: tuple[str, ...],
                   turn: ParsedTurn) -> None:
    for marker in forbidden:
        if marker and marker in text:
            turn.errors.append(f"the output contains the chat marker {marker!r}; end the turn instead")
            break
    for name, content in pairs:
        if name == "think":
            turn.thoughts.append(content.strip())
        elif name == "information":
            turn.errors.append("do not write <information>; tool results are added for you")
        elif name == "answer":
            if turn.answer is not None:
                turn.errors.append("more than one <answer> in one turn")
            turn.answer = content.strip()


def _finish(turn: ParsedTurn, max_calls: int) -> ParsedTurn:
    if turn.answer is not None and turn.calls:
        turn.errors.append("a turn must either call tools or answer, not both")
    if max_calls and len(turn.calls) > max_calls:
        turn.errors.append(f"{len(turn.calls)} tool calls in one turn; at most {max_calls} are allowed")
    if turn.answer is not None and not turn.answer:
        turn.errors.append("the answer is empty")
    if turn.answer is None and not turn.calls and not turn.errors:
        turn.errors.append("no action found")
    return turn


def _tag_args(name: str, content: str, schema: dict[str, Any]) -> dict[str, Any]:
    """Arguments of a tool tag: a JSON object for a tool with several parameters, else the text."""
    props = ((schema.get("function") or {}).get("parameters") or {}).get("properties") or {}
    if len(props) > 1 and content.startswith("{"):
        try:
            obj = json.loads(content)
        except (ValueError, RecursionError):
            obj = None
        if isinstance(obj, dict):
            return obj
    key = first_string_param(schema) or ("url" if name == "access" else "query")
    return {key: content}


def parse_asearcher(text: str, schemas: dict[str, dict[str, Any]], *, lenient: bool = False,
                    max_calls: int = 0, forbidden: tuple[str, ...] = ()) -> ParsedTurn:
    """Parse an ASearcher-format turn. `schemas` maps tool names to their function schemas; each tool
    name is an action tag."""
    tool_tags = tuple(schemas)
    known = tuple(dict.fromkeys((*ASEARCHER_TAGS, *tool_tags)))
    pairs, errors = scan_tags(text, known, lenient=lenient, closable=(*tool_tags, "answer"))
    turn = ParsedTurn(errors=errors)
    _common_checks(text, pairs, forbidden, turn)
    for name, content in pairs:
        if name in RESERVED_TAGS:
            continue
        arg = content.strip()
        if name not in schemas:
            turn.errors.append(f"<{name}> is not available; use {', '.join(f'<{t}>' for t in tool_tags) or '<answer>'}")
        elif not arg:
            turn.errors.append(f"<{name}> is empty")
        else:
            args = _tag_args(name, arg, schemas[name])
            problems = _schema_errors(args, schemas[name]) if len(args) > 1 else []
            if problems:
                turn.errors.append(f"bad arguments for <{name}>: " + "; ".join(problems[:3]))
            else:
                turn.calls.append(ToolCall(name, args))
    return _finish(turn, max_calls)


def _schema_errors(args: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    import jsonschema

    params = (schema.get("function") or {}).get("parameters") or {"type": "object"}
    try:
        found = sorted(jsonschema.Draft202012Validator(params).iter_errors(args), key=lambda e: list(e.path))
    except Exception as e:  # a broken schema is the tool's fault; report it, never raise
        return [f"the tool's schema cannot be checked ({type(e).__name__})"]
    out = []
    for err in found:
        where = ".".join(str(p) for p in err.path)
        out.append(f"{where}: {err.message}" if where else err.message)
    return out


def parse_hermes(text: str, schemas: dict[str, dict[str, Any]], *, lenient: bool = False,
                 max_calls: int = 0, forbidden: tuple[str, ...] = ()) -> ParsedTurn:
    """Parse a Hermes/OpenAI tool-call turn; arguments are validated against each tool's schema."""
    pairs, errors = scan_tags(text, HERMES_TAGS, lenient=lenient, closable=("tool_call", "answer"))
    turn = ParsedTurn(errors=errors)
    _common_checks(text, pairs, forbidden, turn)
    names = ", ".join(sorted(schemas)) or "none"
    for name, content in pairs:
        if name != "tool_call":
            continue
        try:
            obj = json.loads(content.strip())
        except (ValueError, RecursionError) as e:
            turn.errors.append(f"tool call is not valid JSON ({str(e)[:80]})")
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            turn.errors.append('a tool call must be a JSON object {"name": …, "arguments": {…}}')
            continue
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except (ValueError, RecursionError):
                turn.errors.append(f"arguments of {obj['name']!r} are not a JSON object")
                continue
        if not isinstance(args, dict):
            turn.errors.append(f"arguments of {obj['name']!r} must be a JSON object")
            continue
        if obj["name"] not in schemas:
            turn.errors.append(f"unknown tool {obj['name']!r}; available: {names}")
            continue
        problems = _schema_errors(args, schemas[obj["name"]])
        if problems:
            turn.errors.append(f"bad arguments for {obj['name']!r}: " + "; ".join(problems[:3]))
            continue
        turn.calls.append(ToolCall(obj["name"], args))
    return _finish(turn, max_calls)


def parse_read(text: str) -> tuple[str, list[str]]:
    """A read turn (`<think>` prefilled): the notes up to `</think>`, and errors."""
    body = text
    if body.startswith("<think>"):
        body = body[len("<think>"):]
    end = body.find("</think>")
    notes = body if end < 0 else body[:end]
    errors = []
    inner = _tag_re(ASEARCHER_TAGS + ("tool_call",)).search(notes)
    if inner:
        errors.append(f"{inner.group(0)} inside reading notes; write actions after </think>")
    return notes.strip(), errors
