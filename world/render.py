"""Articles: each entity's page, written from the sentence templates, with the facts it states.

A full page has a lead paragraph with the entity's own facts, then paragraphs that mention other
entities: *inverse* mentions of relations ("Notable people born in Tesk include ..."), cross facts
about other entities ("... corresponded with the astronomer Kalo Venn") and filler. These make
retrieval non-trivial (a name turns up on many pages), and because they restate facts that live on
other pages they are recorded: `Page.facts` lists every (subject id, field) a page states, and the
question generator only hops along facts that exactly one page — the subject's own — states.
Short pages (the easy mode) are the lead paragraph only.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from world.graph import Entity, World
from world.names import KNOWN_FOR, PRAISED_FOR, PROGRAMME
from world.templates import GROUPS, Template, article, join_names

PRONOUN_RATE = 0.5
"""Chance that a later sentence refers to the page's entity as He/She/It."""


@dataclass
class Page:
    entity: Entity
    paragraphs: list[str]
    facts: list[tuple[int, str]] = field(default_factory=list)

    @property
    def contents(self) -> str:
        """The full article: title line, blank line, paragraphs separated by blank lines."""
        return "\n\n".join([self.entity.name, *self.paragraphs])


class _Writer:
    """Writes one page: picks templates with the page's own RNG and collects the stated facts."""

    def __init__(self, world: World, e: Entity, short: bool):
        self.world, self.e, self.short = world, e, short
        self.rng = random.Random(f"hexworld:{world.seed}:page:{e.id}")
        self.facts: list[tuple[int, str]] = []
        self.sentences = 0
        self.last: Template | None = None

    def paragraph(self) -> list[str]:
        """Start a paragraph: its first sentence names the entity (passages are read on their own)."""
        self.sentences = 0
        return []

    def say(self, group: str, **bind) -> str:
        t: Template = self.rng.choice(GROUPS[group])
        self.last = t
        pronoun = self.sentences > 0 and self.rng.random() < PRONOUN_RATE
        self.sentences += 1
        return self.fill(t, bind, pronoun)

    def fill(self, t: Template, bind: dict, pronoun: bool) -> str:
        w, out = self.world, []
        bind = {"S": self.e, **bind}
        for i, part in enumerate(t.parts):
            if isinstance(part, str):
                out.append(part)
            elif part.var.startswith("_"):
                out.append(str(bind[part.var]))
            elif part.field is None:
                ent = bind[part.var]
                if part.many:
                    out.append(join_names([x.name for x in ent]))
                else:
                    out.append(ent.pronoun if part.var == "S" and i == 0 and pronoun else ent.name)
            else:
                ent = bind[part.var]
                text = w.text(ent, part.field)
                out.append(f"{article(text)} {text}" if part.article else text)
                self.facts.append((ent.id, part.field))
        for subj, many, fld, obj in t.extra_facts:
            for s in bind[subj] if many else [bind[subj]]:
                if s.rels.get(fld) != (bind[obj].id if obj else None):  # a template may only state what is true
                    raise AssertionError(f"{t.key}: {s.name} {fld} is not {bind[obj].name if obj else 'nothing'}")
                self.facts.append((s.id, fld))
        return "".join(out)

    def pick(self, items: list[Entity], k: int) -> list[Entity]:
        return self.rng.sample(items, min(k, len(items)))

    def others(self, kind: str, not_ids: tuple[int, ...] = ()) -> list[Entity]:
        return [x for x in self.world.of_type(kind) if x.id != self.e.id and x.id not in not_ids]

    def maybe(self, p: float) -> bool:
        return self.rng.random() < p


def render_page(world: World, e: Entity, short: bool = False) -> Page:
    """The article of `e`; `short` keeps only the lead paragraph (the entity's own facts)."""
    w = _Writer(world, e, short)
    if e.lineage is not None:  # always short: nothing else on it, and no other page names these people
        return Page(entity=e, paragraphs=[" ".join(_lineage_lead(w))], facts=w.facts)
    paragraphs = [" ".join(s for s in _LEAD[e.type](w) if s)]
    if not short:
        paragraphs += [" ".join(p) for p in _MORE[e.type](w) if p]
    return Page(entity=e, paragraphs=paragraphs, facts=w.facts)


def _person_lead(w: _Writer) -> list[str]:
    out = [w.say("person.lead")]
    if "S.died" not in w.last.text:  # one lead wording already gives both years
        out.append(w.say("person.died"))
    return out + [w.say("person.member") if "member_of" in w.e.rels else ""]


def _person_more(w: _Writer) -> list[list[str]]:
    e, world, p2 = w.e, w.world, w.paragraph()
    for place in world.subjects("founded_by", e):  # organisations and cities this person founded
        if w.maybe(0.35):
            p2.append(w.say("person.founded", O=place))
    works = world.subjects("created_by", e)
    if works and w.maybe(0.4):
        p2.append(w.say("person.works", W=w.pick(works, 2)))
    cities = w.pick(w.others("city"), 2)
    if w.maybe(0.5) and len(cities) == 2:
        p2.append(w.say("person.travel", C=cities[0], C2=cities[1]))
    else:
        lo, hi = e.attrs["born"] + 15, e.attrs["died"]
        p2.append(w.say("person.visit", C=cities[0], _year=w.rng.randint(lo, max(lo, hi))))
    p3 = w.paragraph()
    if w.maybe(0.5):
        p3.append(w.say("person.friend", O=w.rng.choice(w.others("person"))))
    if w.maybe(0.3):
        p3.append(w.say("person.rival", O=w.rng.choice(w.others("person"))))
    museums = [o for o in w.others("organisation") if o.kind == "museum"]
    if museums and w.maybe(0.25):
        p3.append(w.say("person.portrait", O=w.rng.choice(museums)))
    return [p2, p3]


def _lineage_lead(w: _Writer) -> list[str]:
    out = [w.say("lineage.lead")]
    if "S.died" not in w.last.text:
        out.append(w.say("person.died"))
    return out + [w.say("lineage.master" if "trained_under" in w.e.rels else "lineage.founder")]


def _city_lead(w: _Writer) -> list[str]:
    e, world = w.e, w.world
    out = [w.say("city.lead"), w.say("city.founder" if "founded_by" in e.rels else "city.founded"),
           w.say("city.population"), w.say("city.river")]
    region = world.entities[e.rels["located_in"]]
    if region.rels.get("capital") == e.id and not w.short and w.maybe(0.4):
        out.append(w.say("city.capital", R=region))
    return out


def _city_more(w: _Writer) -> list[list[str]]:
    e, world, p2 = w.e, w.world, w.paragraph()
    natives, firms, events = (world.subjects(r, e) for r in ("born_in", "headquartered_in", "took_place_in"))
    if natives and w.maybe(0.35):
        p2.append(w.say("city.natives", P=sorted(w.pick(natives, w.rng.choice((1, 2))), key=lambda x: x.id)))
    if firms and w.maybe(0.3):
        p2.append(w.say("city.hq", O=sorted(w.pick(firms, w.rng.choice((1, 2))), key=lambda x: x.id)))
    if events and w.maybe(0.3):
        p2.append(w.say("city.hosted", E=w.rng.choice(events)))
    p2.append(w.say("city.filler", _word=w.rng.choice(KNOWN_FOR)))
    p3 = w.paragraph()
    if w.maybe(0.5):
        p3.append(w.say("city.twin", C=w.rng.choice(w.others("city"))))
    if w.maybe(0.5):
        p3.append(w.say("city.cross", C=w.rng.choice(w.others("city"))))
    return [p2, p3]


def _region_lead(w: _Writer) -> list[str]:
    return [w.say("region.lead"), w.say("region.capital"), w.say("region.terrain")]


def _region_more(w: _Writer) -> list[list[str]]:
    e, world, p2 = w.e, w.world, w.paragraph()
    cities = world.subjects("located_in", e)
    if len(cities) >= 2 and w.maybe(0.5):
        p2.append(w.say("region.cities", C=sorted(w.pick(cities, w.rng.choice((2, 3))), key=lambda x: x.id)))
    neighbours = w.others("region")
    if neighbours:
        p2.append(w.say("region.cross" if w.maybe(0.3) else "region.border", R=w.rng.choice(neighbours)))
    return [p2]


def _org_lead(w: _Writer) -> list[str]:
    return [w.say("org.lead"), w.say("org.hq"), w.say("org.employees")]


def _org_more(w: _Writer) -> list[list[str]]:
    e, world, p2 = w.e, w.world, w.paragraph()
    works, members, events = (world.subjects(r, e) for r in ("published_by", "member_of", "organised_by"))
    if works and w.maybe(0.35):
        p2.append(w.say("org.catalogue", W=sorted(w.pick(works, 2), key=lambda x: x.id)))
    if members and w.maybe(0.35):
        p2.append(w.say("org.members", P=sorted(w.pick(members, 2), key=lambda x: x.id)))
    if events and w.maybe(0.3):
        p2.append(w.say("org.events", E=w.rng.choice(events)))
    if w.maybe(0.5):
        p2.append(w.say("org.office", C=w.rng.choice(w.others("city")),
                        _year=w.rng.randint(e.attrs["founded"], e.attrs["founded"] + 80)))
    p2.append(w.say("org.filler", _word=w.rng.choice(KNOWN_FOR)))
    p3 = w.paragraph()
    if w.maybe(0.4):
        p3.append(w.say("org.partner", O=w.rng.choice(w.others("organisation"))))
    if w.maybe(0.3):
        p3.append(w.say("org.cross", O=w.rng.choice(w.others("organisation"))))
    return [p2, p3]


def _work_lead(w: _Writer) -> list[str]:
    e = w.e
    out = [w.say(f"work.lead.{e.kind}")]
    if "published_by" in e.rels:
        out.append(w.say(f"work.pub.{e.kind}"))
    return out


_FILLER_NUMS = {"novel": (80, 900), "film": (60, 200), "album": (6, 18), "painting": (20, 300)}


def _work_more(w: _Writer) -> list[list[str]]:
    e, rng, p2 = w.e, w.rng, w.paragraph()
    lo, hi = _FILLER_NUMS[e.kind]
    p2.append(w.say(f"work.filler.{e.kind}", _num=rng.randint(lo, hi), _num2=rng.randint(lo, hi),
                    _word=rng.choice(PRAISED_FOR)))
    museums = [o for o in w.others("organisation") if o.kind == "museum"]
    if e.kind == "painting" and museums and w.maybe(0.5):
        p2.append(w.say("work.hangs", O=rng.choice(museums)))
    if w.maybe(0.4):
        p2.append(w.say("work.compare", W=rng.choice(w.others("work"))))
    if w.maybe(0.3):
        p2.append(w.say("work.inspired", P=rng.choice(w.others("person", (e.rels["created_by"],)))))
    return [p2]


def _event_lead(w: _Writer) -> list[str]:
    return [w.say("event.lead"), w.say("event.organiser") if "organised_by" in w.e.rels else "",
            w.say("event.attendance")]


def _event_more(w: _Writer) -> list[list[str]]:
    e, rng, p2 = w.e, w.rng, w.paragraph()
    alive = [p for p in w.world.of_type("person") if p.attrs["born"] + 15 <= e.attrs["year"] <= p.attrs["died"]]
    if alive and w.maybe(0.5):
        p2.append(w.say("event.guests", P=sorted(w.pick(alive, rng.choice((1, 2, 3))), key=lambda x: x.id)))
    p2.append(w.say("event.filler", _num=rng.randint(1, 14), _word=rng.choice(PROGRAMME)))
    if w.maybe(0.4):
        p2.append(w.say("event.cross", E=rng.choice(w.others("event"))))
    return [p2]


_LEAD = {"person": _person_lead, "city": _city_lead, "region": _region_lead, "organisation": _org_lead,
         "work": _work_lead, "event": _event_lead}
_MORE = {"person": _person_more, "city": _city_more, "region": _region_more, "organisation": _org_more,
         "work": _work_more, "event": _event_more}
