"""Checking synthesised QA items against the offline world's facts: the pipeline's measured precision.

On the offline world (world/) every fact is known, so an accepted item can be checked
against ground truth rather than against another model's opinion. This measures the precision of
the synthesis pipeline (generator + checks) whatever the models are: the rule below reads only the
world's text, never a model. `WorldTruth(world_dir)` reads the world once with the template reader
(`world.reader.Reader`); `check(item)` applies this rule to one item:

* Normalisation: answers, fact values and fact subjects are compared after SQuAD normalisation
  (`agent.rewards.normalize_answer`: lower-case, no punctuation, no articles, single spaces), so
  numbers compare without thousands separators ("2,800,000" == "2800000").
* `answer_supported` / `answer_fact`: some fact read from the item's source pages (`item["pages"]`)
  has normalised value == normalised answer, or normalised subject == normalised answer. Among
  such facts, `answer_fact` ({subject, field, value, url}; `url` is the page the fact was read
  from) is chosen by, in order: backing one of the item's statements (see below; so a value that
  a nearer page happens to state for another field does not shorten the chain), then the fewest
  page-graph edges from an entity named in the question, then page order, then reading order.
  None when there is no such fact.
* `statements_supported`: the fraction of statements for which some fact read from the statement's
  own `url` has both its subject and its value in the statement text (case-insensitive, numbers
  without thousands separators, whole words). An item without statements scores 0.0: nothing of
  it is evidenced.
* `world_hops`: the entities the question names are the page titles found in its text (exact case,
  whole words, longest title first so "Museum of Zuser" is not also read as "Zuser"). The page graph
  is undirected, with an edge between the page of a fact's subject and the page of its value
  whenever the value is a page title. `world_hops` = the fewest edges from any named entity's page
  to the answer fact's page, plus 1. It is None (unmeasured) when the question names no title,
  which is the case for fully obscured questions, when there is no answer fact, or when no path
  exists. A question that names its own answer (a comparison between named entities) measures 1;
  the synthesis guard rejects such questions, so accepted items do not have them.
* `hops_agree`: `world_hops == item["hops"]`; None when `world_hops` is None.
* `agrees`: `answer_supported` and `statements_supported == 1.0` and `hops_agree` is not False, so
  an unmeasured hop count does not count against an item.

`summarise(checks)` turns a list of checks into counts and fractions for the report.
"""

from __future__ import annotations

import re
from collections import defaultdict, deque
from pathlib import Path
from typing import Any

from agent.rewards import normalize_answer
from world.reader import Fact, Reader, load_pages

_THOUSANDS = re.compile(r"(?<=\d),(?=\d)")


def _plain(text: str) -> str:
    """Lower-case text with numbers written without thousands separators, for containment tests."""
    return _THOUSANDS.sub("", text.lower())


def _mentions(text: str, needle: str) -> bool:
    """Whether `needle` occurs in `text` as whole words (`text` and `needle` already `_plain`)."""
    return bool(needle) and re.search(rf"(?<!\w){re.escape(needle)}(?!\w)", text) is not None


def _fact_dict(f: Fact) -> dict[str, str]:
    return {"subject": f.subject, "field": f.field, "value": f.value, "url": f.url}


class WorldTruth:
    """A world's pages, facts and page graph, read once and used to check many items."""

    def __init__(self, world_dir: str | Path):
        self.pages = load_pages(world_dir)
        self.title_to_url = {contents.partition("\n")[0]: url for url, contents in self.pages.items()}
        reader = Reader(self.title_to_url)
        self.facts_by_url: dict[str, list[Fact]] = {}
        self.graph: dict[str, set[str]] = defaultdict(set)
        for url, contents in self.pages.items():
            self.facts_by_url[url] = reader.read_page(url, contents)[0]  # in reading order: ties are stable
            for f in self.facts_by_url[url]:
                a, b = self.title_to_url.get(f.subject), self.title_to_url.get(f.value)
                if a is not None and b is not None and a != b:
                    self.graph[a].add(b)
                    self.graph[b].add(a)
        longest_first = sorted(self.title_to_url, key=lambda t: (-len(t), t))
        self._titles = re.compile(r"(?<!\w)(?:" + "|".join(map(re.escape, longest_first)) + r")(?!\w)"
                                  if longest_first else r"(?!)")

    def named_pages(self, question: str) -> list[str]:
        """URLs of the pages whose titles the question names, in order of first mention."""
        urls = (self.title_to_url[m.group(0)] for m in self._titles.finditer(question))
        return list(dict.fromkeys(urls))

    def distances(self, sources: list[str]) -> dict[str, int]:
        """Fewest page-graph edges from any of `sources` to every reachable page (breadth-first)."""
        dist = dict.fromkeys(sources, 0)
        queue = deque(sources)
        while queue:
            url = queue.popleft()
            for nxt in self.graph.get(url, ()):
                if nxt not in dist:
                    dist[nxt] = dist[url] + 1
                    queue.append(nxt)
        return dist

    def answer_facts(self, item: dict[str, Any]) -> list[Fact]:
        """Facts read from the item's source pages whose value or subject is the answer, in page order."""
        answer = normalize_answer(str(item.get("answer", "")))
        if not answer:
            return []
        return [f for url in dict.fromkeys(item.get("pages") or []) for f in self.facts_by_url.get(url, ())
                if answer in (normalize_answer(f.value), normalize_answer(f.subject))]

    def statement_facts(self, statement: dict[str, Any]) -> list[Fact]:
        """Facts read from the statement's page whose subject and value both occur in the statement."""
        text = _plain(statement.get("text", ""))
        return [f for f in self.facts_by_url.get(statement.get("url", ""), ())
                if _mentions(text, _plain(f.subject)) and _mentions(text, _plain(f.value))]

    def check(self, item: dict[str, Any]) -> dict[str, Any]:
        """The ground-truth verdict on one item (the rule is in the module docstring)."""
        statements = item.get("statements") or []
        backing = [self.statement_facts(s) for s in statements]
        cited = {f for facts in backing for f in facts}
        dist = self.distances(self.named_pages(item.get("question", "")))
        far = len(self.pages) + 1
        # min() keeps the first of equals, so ties go to page order, then reading order.
        fact = min(self.answer_facts(item), key=lambda f: (f not in cited, dist.get(f.url, far)),
                   default=None)
        world_hops = dist[fact.url] + 1 if fact is not None and fact.url in dist else None
        supported = sum(map(bool, backing)) / len(statements) if statements else 0.0
        hops_agree = None if world_hops is None else world_hops == item.get("hops")
        return {
            "answer_supported": fact is not None,
            "answer_fact": _fact_dict(fact) if fact is not None else None,
            "statements_supported": supported,
            "world_hops": world_hops,
            "hops_agree": hops_agree,
            "agrees": fact is not None and supported == 1.0 and hops_agree is not False,
        }


def summarise(checks: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts and fractions over checks; a fraction is None when its denominator is zero."""
    n = len(checks)
    measured = [c for c in checks if c["world_hops"] is not None]

    def frac(k: int, d: int) -> float | None:
        return k / d if d else None

    verified = sum(c["agrees"] for c in checks)
    answered = sum(c["answer_supported"] for c in checks)
    agree = sum(bool(c["hops_agree"]) for c in measured)
    return {
        "items": n,
        "verified": verified, "verified_fraction": frac(verified, n),
        "answer_supported": answered, "answer_supported_fraction": frac(answered, n),
        "statements_supported_mean": frac(sum(c["statements_supported"] for c in checks), n),
        "hops_measured": len(measured), "hops_measured_fraction": frac(len(measured), n),
        "hops_agree": agree, "hops_agree_fraction": frac(agree, len(measured)),
    }
