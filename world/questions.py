"""Multi-hop questions with known answers and known evidence chains.

A question is a *program* — one or two sides, each a start entity plus a path of functional
relations — and a final step: an attribute of the end entity (bridge), the end entity itself
(bridge whose answer is a name), or the end entities compared on a numeric attribute. Its chain is
the list of pages a reader must open, in hop order; hops = len(chain):

    bridge, attribute answer:  chain = every entity on the path          hops = relations + 1
    bridge, entity answer:     chain = the path without its end entity   hops = relations
    comparison:                chain = both sides' paths, each with its end entity

Soundness rules, enforced here and checked from the text alone by `reader.check_question`:
every fact used (each hop and the final attribute) is stated by exactly one page, the subject's
own, so no page off the chain and no subset of the chain gives a shortcut; entities on a chain
are distinct; only the start entities are named in the question.

Splits are by start entity: each type's entities are shuffled and divided train/dev/test by the
split fractions, and a question belongs to the split of its start entity (a comparison draws both
starts from one split), so dev/test questions start from entities no train question starts from.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field

from world.graph import ASKABLE, ATTRIBUTES, COMPARABLE, TYPES, Entity, World
from world.phrases import ATTR_Q, COMPARE_Q, ENTITY_Q, REL_NP, wordings

SPLITS = ("train", "dev", "test")
ANSWER_TYPES = {"year": "year", "num": "number", "word": "text", "name": "name"}
ENTITY_ANSWER_RATE = 0.4
"""Share of bridge questions whose answer is the end entity's name rather than an attribute."""


@dataclass
class Side:
    ents: list[Entity]
    rels: list[str] = field(default_factory=list)

    def program(self) -> dict:
        return {"start": self.ents[0].name, "path": list(self.rels)}


@dataclass
class Question:
    question: str
    answer: str
    aliases: list[str]
    qtype: str
    chain: list[Entity]
    program: dict
    answer_type: str
    split: str = ""

    @property
    def hops(self) -> int:
        return len(self.chain)

    def row_fields(self) -> dict:
        """The family fields of a QA row: the family (bridge, comparison, lineage), its size parameter
        `n` (hops; N for lineage) and the fewest searches a reader needs (one per chain page)."""
        return {"family": self.qtype, "n": self.hops, "min_searches": self.hops}


def split_entities(world: World, fractions: tuple[float, float, float]) -> dict[int, str]:
    """Entity id -> split: per type, a seeded shuffle cut by the (train, dev, test) fractions."""
    out: dict[int, str] = {}
    for t in TYPES:
        ids = [e.id for e in world.of_type(t)]
        random.Random(f"hexworld:{world.seed}:split:{t}").shuffle(ids)
        n_test, n_dev = round(len(ids) * fractions[2]), round(len(ids) * fractions[1])
        for i, eid in enumerate(ids):
            out[eid] = "test" if i < n_test else "dev" if i < n_test + n_dev else "train"
    return out


def aliases(world: World, e: Entity, attr: str | None) -> list[str]:
    """The answer as written, then other acceptable forms (ASearcher's `aug_answer`)."""
    if attr is None:
        return [e.name] + ([e.name[4:]] if e.name.startswith("The ") else [])
    text = world.text(e, attr)
    if ATTRIBUTES[attr] == "num":
        return [text, text.replace(",", "")]
    if attr == "genre":
        return [text, f"{text} {e.kind}"]
    if attr == "river":
        return [text, f"{text} river"]
    return [text]


class QuestionMaker:
    """Draws questions over the facts that only their subject's page states (`stated_by`)."""

    def __init__(self, world: World, stated_by: dict[tuple[int, str], set[int]], rng: random.Random):
        self.world, self.rng = world, rng

        def sole(eid: int, fld: str) -> bool:
            return stated_by.get((eid, fld)) == {eid}

        self.rels = {e.id: [(r, o) for r, o in sorted(e.rels.items()) if sole(e.id, r)] for e in world.entities}
        self.attrs = {e.id: [a for a in ASKABLE[e.type] if sole(e.id, a)] for e in world.entities}
        self.comparable = {e.id: [a for a in COMPARABLE[e.type] if sole(e.id, a)] for e in world.entities}

    def walk(self, start: Entity, m: int, banned: frozenset[int] = frozenset()) -> Side | None:
        """A random path of m usable relations from `start` through distinct entities."""
        side = Side([start])
        for _ in range(m):
            seen = banned | {x.id for x in side.ents}
            options = [(r, o) for r, o in self.rels[side.ents[-1].id] if o not in seen]
            if not options:
                return None
            rel, obj = self.rng.choice(options)
            side.rels.append(rel)
            side.ents.append(self.world.entities[obj])
        return side

    def describe(self, side: Side, upto: int | None = None) -> str:
        """The noun phrase for entity `upto` of a side (default: its end), built from the start's name."""
        x = side.ents[0].name
        for i, rel in enumerate(side.rels[:upto]):
            x = self.rng.choice(wordings(REL_NP, rel, side.ents[i].kind, plain=i == 0)).format(x=x)
        return x

    def bridge(self, start: Entity, hops: int) -> Question | None:
        w, rng = self.world, self.rng
        if rng.random() < ENTITY_ANSWER_RATE:  # "Who founded the publisher of X?": answer = end entity
            side = self.walk(start, hops)
            if side is None:
                return None
            last, subj, end = side.rels[-1], side.ents[-2], side.ents[-1]
            options = wordings(ENTITY_Q, last, subj.kind, plain=hops == 1)
            text = rng.choice(options).format(x=self.describe(side, hops - 1))
            return self._finish(Question(text, end.name, aliases(w, end, None), "bridge", side.ents[:-1],
                                         {"sides": [side.program()], "attribute": None}, end.type))
        side = self.walk(start, hops - 1)
        if side is None or not self.attrs[side.ents[-1].id]:
            return None
        end = side.ents[-1]
        attr = rng.choice(self.attrs[end.id])
        options = wordings(ATTR_Q, f"{end.type}.{attr}", end.kind, plain=hops == 1)
        text = rng.choice(options).format(x=self.describe(side))
        return self._finish(Question(text, w.text(end, attr), aliases(w, end, attr), "bridge", side.ents,
                                     {"sides": [side.program()], "attribute": attr}, ANSWER_TYPES[ATTRIBUTES[attr]]))

    def comparison(self, start: Entity, hops: int, pool: list[Entity]) -> Question | None:
        """Two sides of m1 + m2 = hops - 2 relations, compared on one numeric attribute."""
        rng = self.rng
        m1 = rng.randint(0, hops - 2)
        first = self.walk(start, m1)
        if first is None or not self.comparable[first.ents[-1].id]:
            return None
        end1 = first.ents[-1]
        attr = rng.choice(self.comparable[end1.id])
        taken = frozenset(x.id for x in first.ents)
        for _ in range(30):
            other = rng.choice(pool)
            second = None if other.id in taken else self.walk(other, hops - 2 - m1, taken)
            if second is None:
                continue
            end2 = second.ents[-1]
            if end2.type == end1.type and attr in self.comparable[end2.id] and end2.attrs[attr] != end1.attrs[attr]:
                sides = [first, second] if rng.random() < 0.5 else [second, first]
                texts, pick = COMPARE_Q[f"{end1.type}.{attr}"]
                ends = [s.ents[-1] for s in sides]
                best = (min if pick == "min" else max)(ends, key=lambda e: e.attrs[attr])
                text = rng.choice(texts).format(a=self.describe(sides[0]), b=self.describe(sides[1]))
                program = {"sides": [s.program() for s in sides], "attribute": attr, "compare": pick}
                return self._finish(Question(text, best.name, aliases(self.world, best, None), "comparison",
                                             sides[0].ents + sides[1].ents, program, best.type))
        return None

    @staticmethod
    def _finish(q: Question) -> Question | None:
        """Reject a question that names a bridge entity (cannot happen with unique stems; guarded)."""
        starts = {s["start"] for s in q.program["sides"]}
        for e in q.chain:
            if e.name not in starts and re.search(rf"\b{re.escape(e.name)}\b", q.question):
                return None
        return q


def make_questions(world: World, stated_by: dict[tuple[int, str], set[int]], total: int, min_hops: int,
                   max_hops: int, fractions: tuple[float, float, float], progress=None) -> list[Question]:
    """`total` questions (fewer if the world is too small), spread evenly over hops min..max; at
    each hop count from 2 on, half bridge and half comparison. Ordered train, dev, test."""
    rng = random.Random(f"hexworld:{world.seed}:questions")
    maker = QuestionMaker(world, stated_by, rng)
    split_of = split_entities(world, fractions)
    out: list[Question] = []
    n_train = total - sum(round(total * f) for f in fractions[1:])
    for split, quota in zip(SPLITS, (n_train, round(total * fractions[1]), round(total * fractions[2])), strict=True):
        pool = [e for e in world.entities if split_of.get(e.id) == split]  # lineage people: none
        if not pool or quota <= 0:
            continue
        cap = max(3, math.ceil(2.5 * quota / len(pool)))  # questions per start entity
        used: dict[int, int] = {}
        seen: set[str] = set()
        made: list[Question] = []
        levels = list(range(min_hops, max_hops + 1))
        for i, hops in enumerate(levels):
            level_quota = quota // len(levels) + (1 if i < quota % len(levels) else 0)
            kinds = [("bridge", level_quota)] if hops == 1 else [
                ("bridge", level_quota - level_quota // 2), ("comparison", level_quota // 2)]
            for qtype, want in kinds:
                got, tries = 0, 0
                while got < want and tries < 60 * want + 100:
                    tries += 1
                    start = rng.choice(pool)
                    if used.get(start.id, 0) >= cap:
                        continue
                    q = maker.bridge(start, hops) if qtype == "bridge" else maker.comparison(start, hops, pool)
                    if q is None:
                        continue
                    key = repr(q.program)
                    if key in seen:
                        continue
                    seen.add(key)
                    for s in q.program["sides"]:
                        sid = next(e.id for e in q.chain if e.name == s["start"])
                        used[sid] = used.get(sid, 0) + 1
                    q.split = split
                    made.append(q)
                    got += 1
                    if progress:
                        progress(1)
        rng.shuffle(made)
        out += made
    return out
