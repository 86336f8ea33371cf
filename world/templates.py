"""Sentence templates: the one place that says how each fact is worded.

The renderer fills templates to write articles; the reader (`reader.py`) compiles each into an
anchored regular expression to read facts back out of the *text*, which is how the tests prove
what an article does and does not state. Slot syntax:

    {S}        the page's own entity: its name, or (not in a page's first sentence) He/She/It
    {X}        another entity's name (X is any other capital letter, optionally with a digit)
    {X+}       a list of names: "A", "A and B", "A, B and C"
    {X.f}      field f of entity X: a relation gives the object's name, an attribute its value;
               the sentence states the fact (X, f)
    {a:X.f}    the same, preceded by "a" or "an"
    {_k}       filler (never a fact); k starts with year, num, word or name

`facts` adds facts that no slot shows: "P+.born_in=S" on "Notable people born in {S} include {P+}."
states that each P was born in S; "S.trained_under=" (nothing after "=") states that S has no
object for the field, which is read back as the value NO_ONE (a lineage's founder had no master). Templates are grouped; all templates in a group take the same
entities, so the renderer can pick any of them for variety.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from world.graph import ATTRIBUTES, RELATIONS

NAME = r"[A-Z][a-z]+(?: (?:[A-Z][a-z]+|of|from))*"
VALUE = {"year": r"\d{3,4}", "num": r"\d{1,3}(?:,\d{3})*", "word": r"[a-z]+(?:[ -][a-z]+)*?", "name": r"[A-Z][a-z]+"}
PRONOUNS = ("He", "She", "It")
NO_ONE = "no one"
"""The value of a fact that says a field has no object ("trained under no one": a lineage's founder)."""
_SLOT = re.compile(r"\{(a:)?([A-Z]\d?|_[a-z]+\d?)(\+)?(?:\.([a-z_]+))?\}")


@dataclass(frozen=True)
class Slot:
    var: str
    field: str | None = None
    article: bool = False
    many: bool = False

    @property
    def kind(self) -> str:
        """entity | year | num | word | name: what text the slot holds."""
        if self.var.startswith("_"):
            return next(k for k in VALUE if self.var[1:].startswith(k))
        if self.field is None or self.field in RELATIONS:
            return "entity"
        return ATTRIBUTES[self.field]


@dataclass(frozen=True)
class Template:
    key: str
    text: str
    facts: tuple[str, ...] = ()

    @cached_property
    def parts(self) -> list[str | Slot]:
        """The text split into literal strings and slots."""
        out: list[str | Slot] = []
        pos = 0
        for m in _SLOT.finditer(self.text):
            out.append(self.text[pos:m.start()])
            out.append(Slot(var=m.group(2), field=m.group(4), article=bool(m.group(1)), many=bool(m.group(3))))
            pos = m.end()
        out.append(self.text[pos:])
        return [p for p in out if p != ""]

    @cached_property
    def slots(self) -> list[Slot]:
        return [p for p in self.parts if isinstance(p, Slot)]

    @cached_property
    def extra_facts(self) -> list[tuple[str, bool, str, str]]:
        """(subject var, subject is a list, field, object var) for each entry of `facts`."""
        out = []
        for spec in self.facts:
            subj, rest = spec.split(".", 1)
            fld, obj = rest.split("=")
            out.append((subj.rstrip("+"), subj.endswith("+"), fld, obj))
        return out

    @cached_property
    def regex(self) -> re.Pattern[str]:
        """Anchored pattern with one group per slot (g0, g1, ...)."""
        pattern = ""
        for part in self.parts:
            if isinstance(part, str):
                pattern += re.escape(part)
                continue
            i = self.slots.index(part)
            body = NAME if part.kind == "entity" else VALUE[part.kind]
            if part.many:
                body = f"{body}(?:, {body})*(?: and {body})?"
            pattern += ("(?:a|an) " if part.article else "") + f"(?P<g{i}>{body})"
        return re.compile(f"^{pattern}$")


def T(key: str, *texts: str, facts: tuple[str, ...] = ()) -> list[Template]:
    return [Template(f"{key}.{i}", t, facts) for i, t in enumerate(texts)]


GROUPS: dict[str, list[Template]] = {
    # --- people -------------------------------------------------------------------------------------
    "person.lead": T("person.lead",
                     "{S} was {a:S.profession} born in {S.born_in} in {S.born}.",
                     "Born in {S.born_in} in {S.born}, {S} worked as {a:S.profession}.",
                     "{S} ({S.born}–{S.died}) was {a:S.profession} born in {S.born_in}."),
    "person.died": T("person.died", "{S} died in {S.died}.", "{S} lived until {S.died}.",
                     "The death of {S} came in {S.died}."),
    "person.member": T("person.member", "{S} was a member of {S.member_of}.", "{S} later joined {S.member_of}.",
                       "For many years {S} belonged to {S.member_of}."),
    "person.founded": T("person.founded", "In {O.founded}, {S} founded {O}.", "{S} founded {O} in {O.founded}.",
                        facts=("O.founded_by=S",)),
    "person.works": T("person.works", "{S} is best known for {W+}.", "{S} is remembered for {W+}.",
                      facts=("W+.created_by=S",)),
    "person.travel": T("person.travel", "{S} trained in {C} before settling in {C2}.",
                       "{S} spent several years in {C} and later in {C2}."),
    "person.visit": T("person.visit", "{S} travelled widely and visited {C} in {_year}.",
                      "{S} is recorded in {C} in {_year}."),
    "person.friend": T("person.friend", "{S} corresponded with the {O.profession} {O}.",
                       "{S} was a close friend of {O}, who was born in {O.born_in}."),
    "person.rival": T("person.rival", "{S} was a rival of {O}.", "{S} often quarrelled with {O}."),
    "person.portrait": T("person.portrait", "A portrait of {S} hangs in {O}.", "{O} holds a portrait of {S}."),
    # --- lineages of masters (their people have only these short articles) ------------------------------
    "lineage.lead": T("lineage.lead", "{S} was {a:S.profession} born in {S.born}.",
                      "Born in {S.born}, {S} worked as {a:S.profession}.", "{S} ({S.born}–{S.died}) was {a:S.profession}."),
    "lineage.master": T("lineage.master", "{S} trained under {S.trained_under}.",
                        "{S} learned the craft from {S.trained_under}.", "{S} was apprenticed to {S.trained_under}.",
                        "{S} studied under {S.trained_under}."),
    "lineage.founder": T("lineage.founder", "{S} trained under no one and started a line of masters.",
                         "{S} was self-taught and founded a line of masters.",
                         "{S} had no master and began a new line of masters.", facts=("S.trained_under=",)),
    # --- cities -------------------------------------------------------------------------------------
    "city.lead": T("city.lead", "{S} is a city in {S.located_in}.", "{S} is a city in the region of {S.located_in}.",
                   "{S} is a town in {S.located_in}."),
    "city.founder": T("city.founder", "{S} was founded in {S.founded} by {S.founded_by}.",
                      "{S.founded_by} founded {S} in {S.founded}.",
                      "{S} was established by {S.founded_by} in {S.founded}."),
    "city.founded": T("city.founded", "{S} was founded in {S.founded}.",
                      "The first settlement at {S} dates from {S.founded}."),
    "city.population": T("city.population", "{S} has a population of {S.population}.",
                         "About {S.population} people live in {S}.", "{S} is home to about {S.population} people."),
    "city.river": T("city.river", "{S} lies on the {S.river} river.", "The {S.river} river flows through {S}."),
    "city.capital": T("city.capital", "{S} is the capital of {R}.", "{S} serves as the capital of {R}.",
                      facts=("R.capital=S",)),
    "city.natives": T("city.natives", "Notable people born in {S} include {P+}.", "{S} is the birthplace of {P+}.",
                      facts=("P+.born_in=S",)),
    "city.hq": T("city.hq", "{S} is home to {O+}.", "Organisations based in {S} include {O+}.",
                 facts=("O+.headquartered_in=S",)),
    "city.hosted": T("city.hosted", "{S} hosted {E} in {E.year}.", "In {E.year}, {S} hosted {E}.",
                     facts=("E.took_place_in=S",)),
    "city.filler": T("city.filler", "{S} is known for its {_word}.", "The old town of {S} is famous for its {_word}."),
    "city.twin": T("city.twin", "{S} is twinned with {C}.", "{S} keeps close ties with {C}."),
    "city.cross": T("city.cross", "Travellers often compare {S} with {C}, which lies on the {C.river} river.",
                    "Trade links connect {S} with {C}, a city of about {C.population} people."),
    # --- regions ------------------------------------------------------------------------------------
    "region.lead": T("region.lead", "{S} is a region covering {S.area} square kilometres.",
                     "{S} is a region of {S.area} square kilometres.",
                     "The region of {S} covers {S.area} square kilometres."),
    "region.capital": T("region.capital", "The capital of {S} is {S.capital}.", "{S} has its capital at {S.capital}."),
    "region.terrain": T("region.terrain", "Most of {S} is {S.terrain}.", "The landscape of {S} is mostly {S.terrain}."),
    "region.cities": T("region.cities", "Cities in {S} include {C+}.", "{S} contains the cities of {C+}.",
                       facts=("C+.located_in=S",)),
    "region.border": T("region.border", "{S} borders {R}.", "{S} shares a long border with {R}."),
    "region.cross": T("region.cross", "{S} borders {R}, whose capital is {R.capital}."),
    # --- organisations ------------------------------------------------------------------------------
    "org.lead": T("org.lead", "{S} is {a:S.kind} founded in {S.founded} by {S.founded_by}.",
                  "{S.founded_by} founded {S}, {a:S.kind}, in {S.founded}.",
                  "{S} is {a:S.kind} that {S.founded_by} established in {S.founded}."),
    "org.hq": T("org.hq", "{S} is headquartered in {S.headquartered_in}.",
                "{S} has its headquarters in {S.headquartered_in}.",
                "The headquarters of {S} are in {S.headquartered_in}."),
    "org.employees": T("org.employees", "{S} employs {S.employees} people.", "{S} has a staff of {S.employees}."),
    "org.catalogue": T("org.catalogue", "The catalogue of {S} includes {W+}.", "{S} has issued {W+}.",
                       facts=("W+.published_by=S",)),
    "org.members": T("org.members", "Members of {S} have included {P+}.", "{S} counted {P+} among its members.",
                     facts=("P+.member_of=S",)),
    "org.events": T("org.events", "{S} organised {E} in {E.year}.", "In {E.year}, {S} organised {E}.",
                    facts=("E.organised_by=S",)),
    "org.office": T("org.office", "{S} opened a branch office in {C} in {_year}.",
                    "{S} has kept a branch office in {C} since {_year}."),
    "org.filler": T("org.filler", "{S} is known for its {_word}.", "{S} has changed owners several times."),
    "org.partner": T("org.partner", "{S} has long collaborated with {O}.", "{S} once tried to merge with {O}."),
    "org.cross": T("org.cross", "{S} is sometimes confused with {O}, {a:O.kind} based in {O.headquartered_in}."),
    # --- creative works (one lead/publisher group per work kind) ------------------------------------
    "work.lead.novel": T("work.lead.novel", "{S} is {a:S.genre} novel by {S.created_by}, published in {S.year}.",
                         "{S.created_by} wrote {S}, {a:S.genre} novel, in {S.year}.",
                         "{S} is {a:S.genre} novel written by {S.created_by} in {S.year}."),
    "work.lead.film": T("work.lead.film", "{S} is {a:S.genre} film directed by {S.created_by} and released in {S.year}.",
                        "{S.created_by} directed {S}, {a:S.genre} film, in {S.year}."),
    "work.lead.album": T("work.lead.album", "{S} is {a:S.genre} album recorded by {S.created_by} in {S.year}.",
                         "{S.created_by} recorded {S}, {a:S.genre} album, in {S.year}."),
    "work.lead.painting": T("work.lead.painting", "{S} is {a:S.genre} painting by {S.created_by}, completed in {S.year}.",
                            "{S.created_by} painted {S}, {a:S.genre} painting, in {S.year}."),
    "work.pub.novel": T("work.pub.novel", "{S} was published by {S.published_by}.", "{S.published_by} published {S}."),
    "work.pub.film": T("work.pub.film", "{S} was produced by {S.published_by}.", "{S.published_by} produced {S}."),
    "work.pub.album": T("work.pub.album", "{S} was released by {S.published_by}.", "{S.published_by} released {S}."),
    "work.filler.novel": T("work.filler.novel", "The book runs to {_num} pages.", "Critics praised its {_word}."),
    "work.filler.film": T("work.filler.film", "The film runs {_num} minutes.", "Critics praised its {_word}."),
    "work.filler.album": T("work.filler.album", "The album contains {_num} songs.", "Critics praised its {_word}."),
    "work.filler.painting": T("work.filler.painting", "The canvas measures {_num} by {_num2} centimetres.",
                              "Critics praised its {_word}."),
    "work.hangs": T("work.hangs", "{S} hangs in {O}.", "{S} is on display at {O}."),
    "work.compare": T("work.compare", "{S} is often compared with {W}, {a:W.genre} {W.kind} by {W.created_by}."),
    "work.inspired": T("work.inspired", "{S} is said to have inspired {P}.", "{P} cited {S} as an early influence."),
    # --- events -------------------------------------------------------------------------------------
    "event.lead": T("event.lead", "{S} was {a:S.kind} held in {S.took_place_in} in {S.year}.",
                    "{S}, {a:S.kind}, took place in {S.took_place_in} in {S.year}.",
                    "In {S.year}, {S.took_place_in} hosted {S}, {a:S.kind}."),
    "event.organiser": T("event.organiser", "{S} was organised by {S.organised_by}.",
                         "{S.organised_by} organised {S}."),
    "event.attendance": T("event.attendance", "{S} drew {S.attendance} visitors.",
                          "About {S.attendance} people attended {S}."),
    "event.guests": T("event.guests", "Guests at {S} included {P+}.", "{P+} attended {S}."),
    "event.filler": T("event.filler", "{S} lasted {_num} days.", "Its programme included {_word}."),
    "event.cross": T("event.cross", "{S} is not to be confused with {E}, held in {E.year}.",
                     "{S} was modelled on {E}, which took place in {E.took_place_in}."),
}
ALL: list[Template] = [t for group in GROUPS.values() for t in group]


def article(word: str) -> str:
    """'a' or 'an' for a lowercase word (an astronomer, a university)."""
    return "an" if re.match(r"[aeio]|u(?!ni)", word) else "a"


def join_names(names: list[str]) -> str:
    """'A', 'A and B', 'A, B and C' (the form `{X+}` slots are read back from)."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def split_names(text: str) -> list[str]:
    head, _, last = text.rpartition(" and ")
    return [*head.split(", "), last] if head else [text]
