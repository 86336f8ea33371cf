"""Action parsing: hand-written cases for both formats, and Hypothesis fuzzing (the parser never raises)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.parser import ParsedTurn, ToolCall, parse_asearcher, parse_hermes, parse_read, scan_tags


def _schema(name: str, param: str, extra: dict | None = None) -> dict:
    props = {param: {"type": "string"}, **(extra or {})}
    return {"type": "function", "function": {"name": name, "description": name, "parameters": {
        "type": "object", "properties": props, "required": [param], "additionalProperties": False}}}


SCHEMAS = {"search": _schema("search", "query", {"topk": {"type": "integer", "minimum": 1}}),
           "access": _schema("access", "url")}
SEARCH_ONLY = {"search": SCHEMAS["search"]}


# --- ASearcher tags ---------------------------------------------------------------------------

def test_asearcher_search_with_thought():
    t = parse_asearcher("<think>need the year</think>\n<search> Varnholt founded </search>", SCHEMAS)
    assert t.ok and t.calls == [ToolCall("search", {"query": "Varnholt founded"})]
    assert t.thoughts == ["need the year"] and t.answer is None


def test_asearcher_access_and_answer():
    assert parse_asearcher("<access>http://a.org/x</access>", SCHEMAS).calls == [ToolCall("access", {"url": "http://a.org/x"})]
    t = parse_asearcher("<think>done</think><answer> 1642 </answer>", SCHEMAS)
    assert t.ok and t.answer == "1642" and not t.calls


def test_asearcher_text_after_stop_tag_is_ignored():
    # an engine may stop on a token that completes the stop string and carries more text
    t = parse_asearcher("<search>q</search>\n\n", SCHEMAS)
    assert t.ok and t.calls[0].args == {"query": "q"}


def test_asearcher_errors():
    cases = {
        "plain words, no tags": "no action found",
        "<search>q": "never closed",
        "<search></search>": "is empty",
        "</search>": "without a matching",
        "<think><search>q</search></think>": "must not nest",
        "<information>made up</information><answer>x</answer>": "do not write <information>",
        "<answer>a</answer><answer>b</answer>": "more than one <answer>",
        "<search>q</search><answer>a</answer>": "either call tools or answer",
        "<answer>  </answer>": "answer is empty",
        "<answer>x</answer><|im_start|>user": "chat marker",
    }
    for text, needle in cases.items():
        t = parse_asearcher(text, SCHEMAS, forbidden=("<|im_start|>",))
        assert not t.ok and any(needle in e for e in t.errors), (text, t.errors)


def test_asearcher_access_unavailable_in_search_only_mode():
    t = parse_asearcher("<access>http://x</access>", SEARCH_ONLY)
    assert not t.ok and "<access> is not available" in t.errors[0] and "<search>" in t.errors[0]


def test_asearcher_max_calls():
    text = "<search>a</search><search>b</search>"
    assert parse_asearcher(text, SCHEMAS, max_calls=2).ok
    t = parse_asearcher(text, SCHEMAS, max_calls=1)
    assert not t.ok and "at most 1" in t.errors[0]


def test_lenient_closes_only_the_final_action_tag():
    assert parse_asearcher("<answer>1932", SCHEMAS, lenient=True).answer == "1932"
    assert parse_asearcher("<search>Varnholt", SCHEMAS, lenient=True).calls[0].args == {"query": "Varnholt"}
    assert not parse_asearcher("<think>unfinished", SCHEMAS, lenient=True).ok
    assert not parse_asearcher("<answer>1932", SCHEMAS).ok


# --- Hermes tool calls ------------------------------------------------------------------------

def test_hermes_calls_validated_against_schema():
    text = ('<think>two lookups</think>\n<tool_call>\n{"name": "search", "arguments": {"query": "a", "topk": 2}}\n'
            '</tool_call>\n<tool_call>{"name": "access", "arguments": "{\\"url\\": \\"http://b\\"}"}</tool_call>')
    t = parse_hermes(text, SCHEMAS)
    assert t.ok, t.errors
    assert t.calls == [ToolCall("search", {"query": "a", "topk": 2}), ToolCall("access", {"url": "http://b"})]


def test_hermes_errors():
    cases = {
        '<tool_call>{"name": "search", "arguments": {}}</tool_call>': "'query' is a required property",
        '<tool_call>{"name": "search", "arguments": {"query": 3}}</tool_call>': "is not of type 'string'",
        '<tool_call>{"name": "search", "arguments": {"query": "a", "topk": 0}}</tool_call>': "minimum",
        '<tool_call>{"name": "search", "arguments": {"query": "a", "x": 1}}</tool_call>': "Additional properties",
        '<tool_call>{"name": "browse", "arguments": {}}</tool_call>': "unknown tool 'browse'; available: access, search",
        '<tool_call>{"name": "search", "arguments": {"query": "a"</tool_call>': "not valid JSON",
        '<tool_call>["search"]</tool_call>': "must be a JSON object",
        '<tool_call>{"name": "search", "arguments": [1]}</tool_call>': "must be a JSON object",
        "I think the answer is 5.": "no action found",
    }
    for text, needle in cases.items():
        t = parse_hermes(text, SCHEMAS)
        assert not t.ok and any(needle in e for e in t.errors), (text, t.errors)


def test_hermes_answer():
    t = parse_hermes("<think>known</think><answer>Dalia Orrent</answer>", SCHEMAS)
    assert t.ok and t.answer == "Dalia Orrent"


def test_parse_read_notes():
    assert parse_read("<think>\nfounded 1642</think>") == ("founded 1642", [])
    notes, errors = parse_read("<think>\nok <search>x</search>")
    assert errors and "<search>" in errors[0]


def test_scan_tags_order():
    pairs, errors = scan_tags("<think>a</think> x <answer>b</answer>", ("think", "answer"))
    assert pairs == [("think", "a"), ("answer", "b")] and not errors


# --- fuzzing ----------------------------------------------------------------------------------

FRAGMENTS = ["<think>", "</think>", "<search>", "</search>", "<access>", "</access>", "<answer>", "</answer>",
             "<information>", "</information>", "<tool_call>", "</tool_call>", "<|im_start|>", "{", "}", '"name"',
             '"arguments"', ":", ",", '"search"', '"access"', '"query"', '"url"', "[", "]", "null", "1", " ",
             "\n", "q", "http://x", "\\", '"', "<", ">", "/", "é", "\x00"]
texts = st.one_of(st.text(max_size=300), st.lists(st.sampled_from(FRAGMENTS), max_size=60).map("".join))


def _check(turn: ParsedTurn, schemas: dict) -> None:
    assert isinstance(turn, ParsedTurn)
    assert all(isinstance(e, str) and e for e in turn.errors)
    if turn.ok:  # a well-formed turn is exactly one kind of action
        assert (turn.answer is not None) != bool(turn.calls)
    for call in turn.calls:
        assert call.name in schemas and isinstance(call.args, dict)


@settings(max_examples=400, deadline=None)
@given(text=texts, lenient=st.booleans())
def test_fuzz_asearcher_never_raises(text, lenient):
    for schemas in (SCHEMAS, SEARCH_ONLY):
        _check(parse_asearcher(text, schemas, lenient=lenient, max_calls=2, forbidden=("<|im_start|>",)), schemas)
    parse_read(text)


@settings(max_examples=400, deadline=None)
@given(text=texts, lenient=st.booleans())
def test_fuzz_hermes_never_raises(text, lenient):
    _check(parse_hermes(text, SCHEMAS, lenient=lenient, max_calls=2), SCHEMAS)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                           lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                           max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(["search", "access", "other", ""]), args=json_values)
def test_fuzz_hermes_json_payloads(name, args):
    text = f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"
    turn = parse_hermes(text, SCHEMAS)
    _check(turn, SCHEMAS)
    if turn.ok:  # only schema-valid calls get through
        assert turn.calls[0].args == args and name in SCHEMAS
