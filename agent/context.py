"""The agent's context in token space, and the context policies that rewrite it.

The context is a list of *blocks*: the rendered initial prompt, then per turn the prefilled text,
the generated tokens (exactly as generated) and the harness text (tool results, markers), each
tokenised once, on its own. The next prompt is the concatenation of the blocks' tokens, which is
kept incrementally as the current segment's `token_ids`: appending a block appends to the segment,
so building a prompt never re-tokenises or re-renders anything.

A policy may *rewrite* earlier context: replace a tool result by its stub (its first characters),
or drop the oldest turns. A rewrite makes the next prompt stop extending the previous one, so a new
segment begins whose first tokens (all loss-masked) are the rewritten context. A segment thus
always satisfies: token_ids = prompt of its first call + for each call its generated tokens and the
harness text appended after them, in order (text after the last call is trimmed when the segment
closes: no call of that segment read it). Under `read_once` and `keep_last_k` the context is
bounded (results shrink to stubs; at the limit the oldest turns go), so the cost of a turn does not
grow with the length of the episode; under `full` it grows until `max_context_tokens`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain

from agent.config import AgentConfig
from agent.trajectory import Segment
from core.registry import ComponentError, Registry


@dataclass
class Block:
    """A run of tokens with one origin."""

    ids: list[int]
    turn: int
    """LLM call this block belongs to (-1: the initial prompt)."""
    kind: str
    """`prompt`, `prefill`, `gen` (policy tokens), `marker` or `result` (a tool result, stubbable)."""
    logprobs: list[float] | None = None
    versions: list[int] | None = None
    stub: str = ""
    """Text that replaces a `result` block when a policy stubs it."""
    page: bool = False
    """A page chunk (read once) rather than a search result."""
    stubbed: bool = False


class TokenContext:
    """Blocks plus the segments they produced; `ids` is the next prompt."""

    def __init__(self, encode_marker: Callable[[str], list[int]], encode_content: Callable[[str], list[int]]):
        self.encode_marker = encode_marker
        self.encode_content = encode_content
        self.blocks: list[Block] = []
        self.segments: list[Segment] = [Segment()]
        self.dropped_turns = 0

    @property
    def segment(self) -> Segment:
        return self.segments[-1]

    @property
    def ids(self) -> list[int]:
        """The live context (the current segment's tokens; do not mutate)."""
        return self.segment.token_ids

    def __len__(self) -> int:
        return len(self.segment.token_ids)

    def add(self, block: Block) -> Block:
        self.blocks.append(block)
        if block.kind == "gen":
            self.segment.append_generated(block.ids, block.logprobs or [], block.versions or [])
        else:
            self.segment.append_prompt(block.ids)
        return block

    def add_text(self, text: str, kind: str, turn: int, *, stub: str = "", page: bool = False) -> Block:
        """Tokenise new harness text on its own (tool text with special tokens taken literally)."""
        ids = self.encode_content(text) if kind == "result" else self.encode_marker(text)
        return self.add(Block(ids, turn, kind, stub=stub, page=page))

    def _rewrite(self) -> None:
        """Start a new segment holding the current blocks (a segment without policy tokens is replaced)."""
        ids = list(chain.from_iterable(b.ids for b in self.blocks))
        n = len(ids)
        seg = Segment(ids, [0] * n, [0.0] * n, [-1] * n)
        if self.segment.num_generated == 0:
            self.segments[-1] = seg
        else:
            trim_tail(self.segments[-1])
            self.segments.append(seg)


    def stub(self, blocks: list[Block]) -> bool:
        """Replace tool results by their stubs; True when the context changed."""
        todo = [b for b in blocks if b.kind == "result" and not b.stubbed]
        for b in todo:
            b.ids, b.stubbed = self.encode_content(b.stub), True
        if todo:
            self._rewrite()
        return bool(todo)

    def drop_oldest(self, target_tokens: int, before_turn: int, note: Callable[[int], str]) -> bool:
        """Drop whole turns (oldest first, only turns < `before_turn`) until at most `target_tokens` remain.

        The dropped turns are replaced by one marker block `note(total dropped)`; True when anything
        was dropped.
        """
        head = [b for b in self.blocks if b.turn < 0 and b.kind != "omitted"]
        body = [b for b in self.blocks if b.turn >= 0]
        total = sum(len(b.ids) for b in head) + sum(len(b.ids) for b in body) + 16  # room for the note
        per_turn: dict[int, int] = {}
        for b in body:
            per_turn[b.turn] = per_turn.get(b.turn, 0) + len(b.ids)
        drop: set[int] = set()
        for t in sorted(per_turn):
            if total <= target_tokens or t >= before_turn:
                break
            drop.add(t)
            total -= per_turn[t]
        if not drop:
            return False
        self.dropped_turns += len(drop)
        omitted = Block(self.encode_marker(note(self.dropped_turns)), -1, "omitted")
        self.blocks = head + [omitted] + [b for b in body if b.turn not in drop]
        self._rewrite()
        return True


def trim_tail(seg: Segment) -> None:
    """Drop the tokens after a segment's last policy token (text no call of this segment ever read)."""
    end = len(seg.loss_mask)
    while end and not seg.loss_mask[end - 1]:
        end -= 1
    if end < len(seg.loss_mask):
        for name in ("token_ids", "loss_mask", "logprobs", "versions"):
            del getattr(seg, name)[end:]


class ContextPolicy:
    """`full`: nothing is ever removed. Subclasses pick results to stub after events."""

    name = "full"
    compacts = False
    """Whether the oldest turns may be dropped when the context is full (see `AgentConfig.compact_to`)."""

    def __init__(self, config: AgentConfig):
        self.config = config

    def after_results(self, ctx: TokenContext, new: list[Block]) -> list[Block]:
        """Called when tool results were appended; returns results to stub now."""
        return []

    def after_read(self, ctx: TokenContext, block: Block) -> list[Block]:
        """Called after the read turn of `block`; returns results to stub now."""
        return []


class ReadOncePolicy(ContextPolicy):
    """ASearcher's policy: a page chunk is shown for its read turn only; the agent's notes stay."""

    name = "read_once"
    compacts = True

    def after_read(self, ctx: TokenContext, block: Block) -> list[Block]:
        return [block] if block.page or self.config.stub_search_results else []


class KeepLastKPolicy(ContextPolicy):
    """The last K tool results stay verbatim; older ones shrink to stubs."""

    name = "keep_last_k"
    compacts = True

    def after_results(self, ctx: TokenContext, new: list[Block]) -> list[Block]:
        live = [b for b in ctx.blocks if b.kind == "result" and not b.stubbed]
        fresh = {id(b) for b in new}  # never stub a result before the model has seen it
        return [b for b in live[: max(len(live) - self.config.keep_last_k, 0)] if id(b) not in fresh]


POLICIES = Registry("context policy", "agent.context_policy")
"""Context policies by name; `agent.context_policy` also takes an import path `package.module:Class`."""
for _policy in (ContextPolicy, ReadOncePolicy, KeepLastKPolicy):
    POLICIES.add(_policy.name, _policy)


def register_policy(cls: type[ContextPolicy]) -> type[ContextPolicy]:
    """Make a policy selectable by `agent.context_policy=<cls.name>` in this process (a class decorator).
    Ray workers on other processes see it only if they import its module: prefer the import path."""
    POLICIES.add(cls.name, cls)
    return cls


def make_policy(config: AgentConfig) -> ContextPolicy:
    """The configured policy (a built-in name, a registered name or `package.module:Class`)."""
    cls = POLICIES.resolve(config.context_policy)
    if not (isinstance(cls, type) and issubclass(cls, ContextPolicy)):
        raise ComponentError(f"agent.context_policy: '{config.context_policy}' is not a ContextPolicy subclass")
    return cls(config)
