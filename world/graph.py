"""The world's knowledge graph: typed entities with functional relations and typed attributes.

Every relation here is *functional* (one object per subject: a person has one birthplace, a work
one creator), which is what lets a question hop along it without ambiguity. Years are kept
roughly consistent (a founder is an adult when founding, a city exists before people are born in
it) so the articles read plausibly. Everything is drawn from one `random.Random`, in a fixed
order, so a seed fixes the world exactly.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from world.names import EVENT_KINDS, LINEAGE_CRAFTS, ORG_KINDS, PROFESSIONS, TERRAINS, WORK_KINDS, NameMaker

BASE_URL = "https://hexwiki.test/wiki/"
TYPES = ("person", "city", "region", "organisation", "work", "event")
SHARES = {"region": 0.05, "city": 0.15, "organisation": 0.15, "work": 0.2, "event": 0.1}  # person: the rest
MIN_ENTITIES = 20

# relation -> (subject types, object type)
RELATIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "born_in": (("person",), "city"),
    "member_of": (("person",), "organisation"),
    "located_in": (("city",), "region"),
    "founded_by": (("city", "organisation"), "person"),
    "capital": (("region",), "city"),
    "headquartered_in": (("organisation",), "city"),
    "created_by": (("work",), "person"),
    "published_by": (("work",), "organisation"),
    "took_place_in": (("event",), "city"),
    "organised_by": (("event",), "organisation"),
    "trained_under": (("person",), "person"),  # lineage people only: the master; a founder has none
}
# attribute -> value kind: year | num (thousands separators) | word (lowercase) | name (capitalised)
ATTRIBUTES = {"born": "year", "died": "year", "founded": "year", "year": "year", "population": "num",
              "area": "num", "employees": "num", "attendance": "num", "profession": "word", "genre": "word",
              "kind": "word", "terrain": "word", "river": "name"}
# Attributes a question may ask for, and the numeric ones a comparison may compare, per type.
ASKABLE = {"person": ("born", "died", "profession"), "city": ("founded", "population", "river"),
           "region": ("area",), "organisation": ("founded", "employees"), "work": ("year", "genre"),
           "event": ("year", "attendance")}
COMPARABLE = {"person": ("born", "died"), "city": ("founded", "population"), "region": ("area",),
              "organisation": ("founded", "employees"), "work": ("year",), "event": ("year", "attendance")}


@dataclass
class Entity:
    """One encyclopedia subject; `rels` maps a relation to the object's id."""

    id: int
    type: str
    name: str
    kind: str = ""
    """Subtype: organisation kind, work kind or event kind ("" for people, cities, regions)."""
    pronoun: str = "It"
    attrs: dict[str, int | str] = field(default_factory=dict)
    rels: dict[str, int] = field(default_factory=dict)
    lineage: int | None = None
    """Index of the lineage of masters this person belongs to; None for the encyclopedia's own entities."""

    @property
    def url(self) -> str:
        return BASE_URL + self.name.replace(" ", "_")


@dataclass
class World:
    """All entities (index = id) plus the inverse of every relation, for rendering mentions."""

    seed: int
    entities: list[Entity]
    lineages: list[list[int]] = field(default_factory=list)
    """Each lineage's member ids, founder first; its people come after every other entity."""
    inverse: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    _by_type: dict[str, list[Entity]] = field(default_factory=dict, repr=False)

    def of_type(self, kind: str) -> list[Entity]:
        """Entities of one type, in id order, lineage people left out: no other page mentions them and
        other questions never start from them (cached: the world is not changed after building)."""
        if not self._by_type:
            for t in TYPES:
                self._by_type[t] = [e for e in self.entities if e.type == t and e.lineage is None]
        return self._by_type[kind]

    def text(self, e: Entity, fld: str) -> str:
        """How a field of `e` is written in articles and answers (relations: the object's name)."""
        if fld in RELATIONS:
            return self.entities[e.rels[fld]].name
        value = e.attrs[fld]
        return f"{value:,}" if ATTRIBUTES[fld] == "num" else str(value)

    def subjects(self, rel: str, obj: Entity) -> list[Entity]:
        """Entities whose `rel` points at `obj` (e.g. people born in a city), in id order."""
        return [self.entities[i] for i in self.inverse.get((rel, obj.id), [])]


def _round_sig(x: float, digits: int = 3) -> int:
    if x < 10 ** digits:
        return int(round(x))
    scale = 10 ** (int(math.log10(x)) - digits + 1)
    return int(round(x / scale) * scale)


def _log_uniform(rng: random.Random, lo: float, hi: float) -> int:
    return _round_sig(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _counts(n: int) -> dict[str, int]:
    counts = {t: max(2 if t == "region" else 3, round(share * n)) for t, share in SHARES.items()}
    counts["person"] = n - sum(counts.values())
    return counts


def build_graph(n: int, seed: int, lineages: int = 0, lineage_length: int = 32) -> World:
    """Draw `n` entities and their relations, then `lineages` lineages of `lineage_length` masters
    (drawn after everything else, from their own RNG, so they leave the other entities unchanged).
    Raises ValueError for n below MIN_ENTITIES."""
    if n < MIN_ENTITIES:
        raise ValueError(f"a world needs at least {MIN_ENTITIES} entities, got {n}")
    rng = random.Random(f"hexworld:{seed}:graph")
    names = NameMaker(random.Random(f"hexworld:{seed}:names"))
    counts = _counts(n)
    ents: list[Entity] = []

    def new(etype: str, name: str, **kw) -> Entity:
        e = Entity(id=len(ents), type=etype, name=name, **kw)
        ents.append(e)
        return e

    regions = [new("region", names.stem(), attrs={"area": _round_sig(rng.uniform(800, 90000)),
                                                   "terrain": rng.choice(TERRAINS)})
               for _ in range(counts["region"])]
    rivers = [names.stem() for _ in range(max(2, counts["city"] // 3))]
    cities = []
    for i in range(counts["city"]):
        region = regions[i] if i < len(regions) else rng.choice(regions)  # every region gets a city
        cities.append(new("city", names.stem(), attrs={
            "founded": rng.randint(600, 1850), "population": _log_uniform(rng, 800, 3_000_000),
            "river": rng.choice(rivers)}, rels={"located_in": region.id}))
    for region in regions:
        region.rels["capital"] = rng.choice([c for c in cities if c.rels["located_in"] == region.id]).id

    people = []
    for _ in range(counts["person"]):
        born = rng.randint(1100, 1950)
        home = [c for c in cities if c.attrs["founded"] < born] or [min(cities, key=lambda c: c.attrs["founded"])]
        people.append(new("person", names.person(), pronoun=rng.choice(("He", "She")), attrs={
            "born": born, "died": born + rng.randint(30, 92), "profession": rng.choice(PROFESSIONS)},
            rels={"born_in": rng.choice(home).id}))
    for city in cities:  # about half the cities have a recorded founder who was an adult at the time
        founders = [p for p in people if p.attrs["born"] + 20 <= city.attrs["founded"] <= p.attrs["died"]]
        if founders and rng.random() < 0.5:
            city.rels["founded_by"] = rng.choice(founders).id

    orgs = []
    for i in range(counts["organisation"]):
        kind = ORG_KINDS[i] if i < len(ORG_KINDS) else rng.choice(ORG_KINDS)
        founder = rng.choice(people)
        founded = rng.randint(founder.attrs["born"] + 20, max(founder.attrs["born"] + 20, founder.attrs["died"]))
        hq = [c for c in cities if c.attrs["founded"] < founded] or cities
        orgs.append(new("organisation", names.organisation(kind), kind=kind, attrs={
            "founded": founded, "employees": _log_uniform(rng, 12, 40_000), "kind": kind},
            rels={"founded_by": founder.id, "headquartered_in": rng.choice(hq).id}))
    for p in people:
        clubs = [o for o in orgs if o.attrs["founded"] <= p.attrs["died"] - 10]
        if clubs and rng.random() < 0.7:
            p.rels["member_of"] = rng.choice(clubs).id

    work_kinds = list(WORK_KINDS)
    for _ in range(counts["work"]):
        kind = rng.choices(work_kinds, weights=[WORK_KINDS[k][0] for k in work_kinds])[0]
        _, pub_kind, genres = WORK_KINDS[kind]
        creator = rng.choice(people)
        year = rng.randint(creator.attrs["born"] + 16, creator.attrs["died"])
        w = new("work", names.work_title(), kind=kind, attrs={"year": year, "genre": rng.choice(genres),
                                                                "kind": kind}, rels={"created_by": creator.id})
        houses = [o for o in orgs if o.kind == pub_kind and o.attrs["founded"] <= year]
        if houses and rng.random() < 0.85:
            w.rels["published_by"] = rng.choice(houses).id

    suffixes = list(EVENT_KINDS)
    for _ in range(counts["event"]):
        suffix, year = rng.choice(suffixes), rng.randint(1150, 1990)
        kind = rng.choice(EVENT_KINDS[suffix])
        hosts = [c for c in cities if c.attrs["founded"] < year] or cities
        e = new("event", names.event(suffix), kind=kind, attrs={
            "year": year, "attendance": _log_uniform(rng, 200, 250_000), "kind": kind},
            rels={"took_place_in": rng.choice(hosts).id})
        organisers = [o for o in orgs if o.attrs["founded"] <= year]
        if organisers and rng.random() < 0.7:
            e.rels["organised_by"] = rng.choice(organisers).id

    world = World(seed=seed, entities=ents)
    world.lineages = [_lineage(ents, names, random.Random(f"hexworld:{seed}:lineage:{i}"), i, lineage_length, craft)
                      for i, craft in enumerate(_crafts(random.Random(f"hexworld:{seed}:crafts"), lineages))]
    for e in ents:
        for rel, obj in e.rels.items():
            world.inverse.setdefault((rel, obj), []).append(e.id)
    return world


def _crafts(rng: random.Random, lineages: int) -> list[str]:
    """The craft of each lineage: a few crafts, each shared by about four lineages or more, so that a
    craft never singles out one lineage (searching for "the founding glassblower" finds several)."""
    kinds = rng.sample(LINEAGE_CRAFTS, max(1, min(len(LINEAGE_CRAFTS), lineages // 4)))
    return [kinds[i % len(kinds)] for i in range(lineages)]


def _lineage(ents: list[Entity], names: NameMaker, rng: random.Random, index: int, length: int, craft: str) -> list[int]:
    """Append one lineage of `length` people (founder first, each the pupil of the one before) to `ents`.

    A pupil is born 12-26 years after the master (a lineage of more than 64 draws from a narrower range,
    down to 12 years at 128), whom the pupil outlives or who lives at least 20 years past the pupil's birth;
    the last pupil is born 1850-1980, so the founder stays after 200 (the reader reads no year before 0)."""
    earliest_last, earliest_founder = 1850, 200
    # 26 up to 64 people (those worlds are unchanged); 12 at lineage.MAX_LENGTH = 128
    widest = min(26, (earliest_last - earliest_founder) // (length - 1))
    gaps = [rng.randint(12, widest) for _ in range(length - 1)]
    born = rng.randint(earliest_last, 1980) - sum(gaps)
    ids: list[int] = []
    for i in range(length):
        gap = gaps[i] if i < len(gaps) else 0
        e = Entity(id=len(ents), type="person", name=names.person(), pronoun=rng.choice(("He", "She")),
                   attrs={"born": born, "died": born + rng.randint(max(45, gap + 20), 90), "profession": craft},
                   lineage=index, rels={"trained_under": ids[-1]} if ids else {})
        ents.append(e)
        ids.append(e.id)
        born += gap
    return ids
