"""How questions are worded: relation noun phrases, attribute questions, comparisons.

A bridge question is a noun phrase built inside-out from the start entity's name along the
relation path ("the founder of" + "the house that published" + "The Lantern of Davesh"), wrapped
in a question about the end entity. Bridge entities are never named: each hop is a description.
Relations whose subject is a work are worded per work kind ("the director of" a film).
"""

from __future__ import annotations

# Every table maps a key to (wordings that read well around a nested description — the "{x}" comes
# last or nearly last —, wordings only used around a plain name).

# relation -> noun phrase for the relation's object, given its subject {x}
REL_NP: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "born_in": (("the birthplace of {x}",), ("the city where {x} was born",)),
    "member_of": (("the organisation whose members included {x}",), ("the organisation {x} belonged to",)),
    "located_in": (("the region that contains {x}",), ("the region where {x} lies",)),
    "founded_by": (("the founder of {x}", "the person who founded {x}"), ()),
    "capital": (("the capital of {x}",), ()),
    "headquartered_in": (("the city that hosts the headquarters of {x}",), ("the city where {x} is headquartered",)),
    "took_place_in": (("the city that hosted {x}",), ("the city where {x} took place",)),
    "organised_by": (("the organiser of {x}", "the organisation that organised {x}"), ()),
    "created_by:novel": (("the author of {x}", "the writer of {x}"), ()),
    "created_by:film": (("the director of {x}",), ()),
    "created_by:album": (("the artist who recorded {x}",), ()),
    "created_by:painting": (("the painter of {x}", "the artist who painted {x}"), ()),
    "published_by:novel": (("the publisher of {x}", "the house that published {x}"), ()),
    "published_by:film": (("the studio that produced {x}",), ()),
    "published_by:album": (("the label that released {x}",), ()),
}

# "type.attribute" -> questions about the attribute of {x}; work years per work kind
ATTR_Q: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "person.born": (("What is the birth year of {x}?",), ("In what year was {x} born?", "When was {x} born?")),
    "person.died": (("What is the year of death of {x}?",), ("In what year did {x} die?", "When did {x} die?")),
    "person.profession": (("What was the profession of {x}?",), ("What did {x} do for a living?",)),
    "city.founded": (("What is the founding year of {x}?",), ("In what year was {x} founded?", "When was {x} founded?")),
    "city.population": (("What is the population of {x}?",), ("How many people live in {x}?",)),
    "city.river": (("Which river flows through {x}?",), ("On which river does {x} lie?",)),
    "region.area": (("What is the area, in square kilometres, of {x}?",), ("How many square kilometres does {x} cover?",)),
    "organisation.founded": (("What is the founding year of {x}?",),
                             ("In what year was {x} founded?", "When was {x} founded?")),
    "organisation.employees": (("How large is the staff of {x}?",), ("How many people does {x} employ?",)),
    "work.year:novel": (("In what year was {x} published?",), ()),
    "work.year:film": (("In what year was {x} released?",), ()),
    "work.year:album": (("In what year was {x} released?",), ()),
    "work.year:painting": (("In what year was {x} completed?",), ()),
    "work.genre": (("What is the genre of {x}?",), ("To which genre does {x} belong?",)),
    "event.year": (("In what year did {x} take place?",), ("When was {x} held?",)),
    "event.attendance": (("How many people attended {x}?",), ("How many visitors did {x} draw?",)),
}

# last relation -> questions whose answer is the entity it points to, given its subject {x}
ENTITY_Q: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "born_in": (("What is the birthplace of {x}?",), ("In which city was {x} born?", "Where was {x} born?")),
    "member_of": (("Which organisation included among its members {x}?",),
                  ("Which organisation did {x} belong to?", "Of which organisation was {x} a member?")),
    "located_in": (("Which region contains {x}?",), ("In which region does {x} lie?", "In which region is {x}?")),
    "founded_by": (("Who founded {x}?",), ()),
    "capital": (("What is the capital of {x}?", "Which city is the capital of {x}?"), ()),
    "headquartered_in": (("Which city hosts the headquarters of {x}?",),
                         ("Where is {x} headquartered?", "In which city is {x} based?")),
    "took_place_in": (("Which city hosted {x}?",), ("Where did {x} take place?", "In which city was {x} held?")),
    "organised_by": (("Who organised {x}?", "Which organisation organised {x}?"), ()),
    "created_by:novel": (("Who wrote {x}?",), ()),
    "created_by:film": (("Who directed {x}?",), ()),
    "created_by:album": (("Who recorded {x}?",), ()),
    "created_by:painting": (("Who painted {x}?",), ()),
    "published_by:novel": (("Who published {x}?", "Which house published {x}?"), ()),
    "published_by:film": (("Which studio produced {x}?",), ()),
    "published_by:album": (("Which label released {x}?",), ()),
}

# (type, attribute) -> (questions about {a} and {b}, "min" or "max": which one is the answer)
COMPARE_Q: dict[str, tuple[tuple[str, ...], str]] = {
    "person.born": (("Who was born earlier, {a} or {b}?", "Who was born first, {a} or {b}?"), "min"),
    "person.died": (("Who died earlier, {a} or {b}?",), "min"),
    "city.founded": (("Which city was founded earlier, {a} or {b}?", "Which city is older, {a} or {b}?"), "min"),
    "city.population": (("Which city has the larger population, {a} or {b}?",
                         "Which city has more inhabitants, {a} or {b}?"), "max"),
    "region.area": (("Which region is larger, {a} or {b}?", "Which region covers a larger area, {a} or {b}?"), "max"),
    "organisation.founded": (("Which organisation was founded earlier, {a} or {b}?",), "min"),
    "organisation.employees": (("Which organisation employs more people, {a} or {b}?",), "max"),
    "work.year": (("Which work is older, {a} or {b}?", "Which work appeared first, {a} or {b}?"), "min"),
    "event.year": (("Which event took place earlier, {a} or {b}?", "Which event was held first, {a} or {b}?"), "min"),
    "event.attendance": (("Which event drew more visitors, {a} or {b}?",), "max"),
}


def wordings(table: dict, key: str, kind: str, plain: bool) -> tuple[str, ...]:
    """Wordings for `key` (or `key:kind` where the work kind matters); `plain`: {x} is just a name."""
    nested, name_only = table[key] if key in table else table[f"{key}:{kind}"]
    return nested + name_only if plain else nested

# Lineage questions: {x} is the start member; the answer is the founder of {x}'s line of masters.
LINEAGE_Q: tuple[str, ...] = (
    "{x} learned the craft from a master, who learned it from another, and so on. Who started this line of masters?",
    "{x} trained under a master, who had trained under another master, and so on back. Who founded this line?",
    "Follow the masters of {x} back: {x}'s master, that master's master, and so on. Who started the line?",
    "Who founded the line of masters to which {x} belongs?",
)
