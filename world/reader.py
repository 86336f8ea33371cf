"""Reading facts back out of article *text*, and answering a question's program from them.

This is the check that a question means what it says, independent of the generator's internal
tables: the reader knows only page text and the sentence templates. It splits each page into
sentences, matches each against every template's anchored regex, and turns slots back into facts
`(subject name, field, value as written)`. `solve` then follows a question's program (start
entity, relation path, final attribute or comparison) through the facts of an allowed set of
pages. A k-hop question is *minimal* when it is solved from its k chain pages and is not solved
from all pages minus any one chain page; since facts are functional and conflict-free, that means
no proper subset of the chain, with or without any off-chain page, answers it.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from world.templates import ALL, NO_ONE, PRONOUNS, Template, split_names

_SENTENCE_END = re.compile(r"(?<=\.)\s+(?=[A-Z])")


@dataclass(frozen=True)
class Fact:
    subject: str
    field: str
    value: str
    url: str
    sentence: str


class Reader:
    """Extracts facts from article text by the sentence templates; `titles` are the known names."""

    def __init__(self, titles: Iterable[str]):
        self.titles = set(titles)
        # Templates that open with literal text are only tried on sentences that open with it.
        self._templates: list[tuple[str, Template]] = [
            (t.parts[0] if isinstance(t.parts[0], str) else "", t) for t in ALL]

    def read_sentence(self, sentence: str, title: str, url: str) -> list[Fact] | None:
        """The facts a sentence states ([] for filler); None when no template matches it."""
        for prefix, t in self._templates:
            if not sentence.startswith(prefix):
                continue
            m = t.regex.match(sentence)
            if m is not None:
                facts = self._bind(t, m, title, url, sentence)
                if facts is not None:
                    return facts
        return None

    def _bind(self, t: Template, m: re.Match, title: str, url: str, sentence: str) -> list[Fact] | None:
        names: dict[str, list[str]] = {"S": [title]}
        for i, slot in enumerate(t.slots):
            if slot.field is not None or slot.var.startswith("_"):
                continue
            text = m.group(f"g{i}")
            if slot.var == "S":
                if not (text == title or (text in PRONOUNS and t.parts[0] is slot)):
                    return None  # the page's own entity must be the page's title
                continue
            found = split_names(text) if slot.many else [text]
            if any(n not in self.titles for n in found):
                return None
            names[slot.var] = found
        facts = []
        for i, slot in enumerate(t.slots):
            if slot.field is None:
                continue
            value = m.group(f"g{i}")
            if slot.kind == "entity" and value not in self.titles:
                return None
            facts.append(Fact(names[slot.var][0], slot.field, value, url, sentence))
        for subj, _, fld, obj in t.extra_facts:
            facts += [Fact(s, fld, names[obj][0] if obj else NO_ONE, url, sentence) for s in names[subj]]
        return facts

    def read_page(self, url: str, contents: str) -> tuple[list[Fact], list[str]]:
        """(facts, sentences no template matched) of one page; the title is its first line."""
        title, _, body = contents.partition("\n")
        facts: list[Fact] = []
        unread: list[str] = []
        for paragraph in body.split("\n\n"):
            for sentence in _SENTENCE_END.split(paragraph.strip()) if paragraph.strip() else []:
                got = self.read_sentence(sentence, title, url)
                if got is None:
                    unread.append(sentence)
                else:
                    facts += got
        return facts, unread


class FactBase:
    """Facts indexed by (subject, field); a lookup can be limited to a set of page URLs."""

    def __init__(self, facts: Iterable[Fact]):
        self.index: dict[tuple[str, str], list[Fact]] = defaultdict(list)
        for f in facts:
            self.index[(f.subject, f.field)].append(f)

    def get(self, subject: str, fld: str, allowed: Container[str] | None = None) -> Fact | None:
        """The fact, if the allowed pages state exactly one value for it."""
        hits = [f for f in self.index.get((subject, fld), ()) if allowed is None or f.url in allowed]
        return hits[0] if hits and len({f.value for f in hits}) == 1 else None

    def conflicts(self) -> list[tuple[str, str, list[str]]]:
        """(subject, field, values) wherever pages disagree — a consistent world has none."""
        return [(s, f, sorted({x.value for x in hits})) for (s, f), hits in sorted(self.index.items())
                if len({x.value for x in hits}) > 1]


@dataclass
class Solution:
    answer: str
    evidence: list[Fact] = field(default_factory=list)


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def solve(program: dict, kb: FactBase, allowed: Container[str] | None = None) -> Solution | None:
    """Follow the program through the allowed pages' facts; None when a needed fact is missing.

    program = {"sides": [{"start": name, "path": [relation, ...]}, ...], "attribute": field | None,
               "compare": "min" | "max" (comparison questions only),
               "follow": relation (lineage questions only: after the path, follow the relation until
                         a page states it has no object, NO_ONE; that entity is the end)}
    """
    evidence: list[Fact] = []
    ends = []
    for side in program["sides"]:
        name = side["start"]
        for rel in side["path"]:
            f = kb.get(name, rel, allowed)
            if f is None:
                return None
            evidence.append(f)
            name = f.value
        if "follow" in program:
            seen = {name}
            while (f := kb.get(name, program["follow"], allowed)) is not None and f.value != NO_ONE:
                if f.value in seen:  # a cycle has no end
                    return None
                evidence.append(f)
                seen.add(name := f.value)
            if f is None:  # the line's end is not known from these pages
                return None
            evidence.append(f)
        ends.append(name)
    attr = program.get("attribute")
    values = []
    for name in ends:
        if attr is None:
            values.append(name)
            continue
        f = kb.get(name, attr, allowed)
        if f is None:
            return None
        evidence.append(f)
        values.append(f.value)
    if "compare" not in program:
        return Solution(values[0], evidence)
    nums = [_number(v) for v in values]
    if len(set(nums)) != len(nums):
        return None
    best = (min if program["compare"] == "min" else max)(range(len(nums)), key=nums.__getitem__)
    return Solution(ends[best], evidence)


def load_pages(world_dir: str | Path) -> dict[str, str]:
    """url -> page contents from a world folder's pages.jsonl."""
    pages = {}
    with open(Path(world_dir) / "pages.jsonl", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            pages[row["url"]] = row["contents"]
    return pages


def read_world(world_dir: str | Path) -> tuple[dict[str, str], FactBase, list[str]]:
    """(pages, facts of all pages, sentences no template matched) of a world folder."""
    pages = load_pages(world_dir)
    reader = Reader(c.partition("\n")[0] for c in pages.values())
    facts: list[Fact] = []
    unread: list[str] = []
    for url, contents in pages.items():
        got, missed = reader.read_page(url, contents)
        facts += got
        unread += missed
    return pages, FactBase(facts), unread


def check_question(row: dict, pages: dict[str, str], kb: FactBase, mentions: dict[str, set[str]] | None = None
                   ) -> list[str]:
    """Problems with one QA row (empty when it is sound): answerable from exactly its chain,
    no chain page dispensable, and no bridge entity named in the question; for a lineage question
    also the rules of `_lineage_problems` (`mentions`: a `mention_index(pages)`, built if not given)."""
    chain, program, problems = row["chain"], row["program"], []
    if len(chain) != row["hops"] or len(set(chain)) != len(chain):
        problems.append(f"chain of {len(chain)} pages for {row['hops']} hops")
    got = solve(program, kb, set(chain))
    if got is None or got.answer != row["answer"]:
        problems.append(f"chain pages give {got.answer if got else None!r}, not {row['answer']!r}")
    everything = set(pages)
    for url in chain:
        if solve(program, kb, everything - {url}) is not None:
            problems.append(f"answerable without {url}")
    starts = {side["start"] for side in program["sides"]}
    for url in chain:
        title = pages[url].partition("\n")[0]
        if title not in starts and re.search(rf"\b{re.escape(title)}\b", row["question"]):
            problems.append(f"bridge entity {title!r} named in the question")
    if "follow" in program:
        problems += _lineage_problems(row, pages, kb, mentions if mentions is not None else mention_index(pages))
    return problems


def mention_index(pages: dict[str, str]) -> dict[str, set[str]]:
    """Capitalised word -> URLs of the pages whose text contains it. Every name word is used by one
    entity only, so the pages that contain a person's first name word are the pages that mention the person."""
    out: dict[str, set[str]] = defaultdict(set)
    for url, contents in pages.items():
        for word in set(re.findall(r"\b[A-Z][a-z]+\b", contents)):
            out[word].add(url)
    return out


def _lineage_problems(row: dict, pages: dict[str, str], kb: FactBase, mentions: dict[str, set[str]]) -> list[str]:
    """A lineage question's extra rules: each member's master is stated on the member's own page only,
    and a member is mentioned only on their own page and on their one pupil's page (so no page off the
    chain names a chain member, except the start's pupil naming the start, and the founder's name is on
    the founder's and the founder's pupil's pages alone)."""
    problems = []
    follow = row["program"]["follow"]
    url_of = {contents.partition("\n")[0]: url for url, contents in pages.items()}
    pupils: dict[str, list[str]] = defaultdict(list)
    for (subject, fld), facts in kb.index.items():
        if fld == follow:
            for f in facts:
                pupils[f.value].append(subject)
    for url in row["chain"]:
        title = pages[url].partition("\n")[0]
        stated = {f.url for f in kb.index.get((title, follow), ())}
        if stated != {url} or len(kb.index[(title, follow)]) != 1:
            problems.append(f"the master of {title!r} is stated {len(kb.index.get((title, follow), ()))} times, "
                            f"on {sorted(stated)}, not once on its own page")
        if len(set(pupils[title])) > 1:
            problems.append(f"{title!r} has {len(set(pupils[title]))} pupils: lineages must not branch or share members")
        allowed = {url, *(url_of.get(p) for p in pupils[title])}
        extra = sorted(mentions.get(title.split()[0], set()) - allowed)
        if extra:
            problems.append(f"chain member {title!r} is mentioned on {len(extra)} other page(s), e.g. {extra[0]}")
    return problems


def verify_world(world_dir: str | Path, files: Iterable[str] = ("qa_train.jsonl", "qa_dev.jsonl", "qa_test.jsonl")
                 ) -> dict:
    """Check every question of a world folder from its text alone; returns counts and problems."""
    pages, kb, unread = read_world(world_dir)
    mentions = mention_index(pages)
    report: dict = {"pages": len(pages), "unread_sentences": len(unread), "conflicts": len(kb.conflicts()),
                    "questions": 0, "sound": 0, "problems": []}
    for name in files:
        with open(Path(world_dir) / name, encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line)
                report["questions"] += 1
                problems = check_question(row, pages, kb, mentions)
                report["sound"] += not problems
                report["problems"] += [f"{row['id']}: {p}" for p in problems]
    report["problems"] += [f"unread sentence: {s!r}" for s in unread[:20]]
    return report
