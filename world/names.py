"""Contamination-free names and the small vocabularies the world draws attributes from.

Every name is built from random syllables, and every syllable *word* (a "stem") is used once in
the whole world, so no entity's name occurs inside another's and a model cannot know any fact
about them from pre-training. Stems are 2-3 syllables of consonant-vowel(-coda) shape, which keeps
them pronounceable ("Vemar", "Tolidun", "Kasora").
"""

from __future__ import annotations

import random

_ONSETS = ("b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "tr")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ai", "ou")
_CODAS = ("", "", "", "", "n", "r", "l", "s", "m")
# Words that would read as English (or clash with the sentence templates) are never used as stems.
_BLOCKED = frozenset({
    "born", "about", "most", "guests", "cities", "members", "notable", "trade", "travellers", "critics",
    "among", "for", "later", "the", "its", "his", "her", "she", "it", "he", "in", "and", "of", "from",
    "tale", "tore", "bore", "more", "lore", "sole", "dole", "pole", "mole", "hole", "role", "rose", "nose",
    "bale", "dale", "gale", "hale", "male", "pale", "sale", "vale", "bane", "dane", "lane", "mane", "pane",
    "sane", "vane", "bone", "done", "gone", "lone", "none", "tone", "zone", "dome", "home", "rome", "tome",
    "mare", "bare", "dare", "fare", "hare", "rare", "ware", "mine", "dine", "fine", "line", "nine", "pine",
    "vine", "wine", "tide", "ride", "side", "hide", "bide", "sore", "kale", "rule", "mule", "tune",
})

# Substrings that could make a stem read as an English slur or obscenity.
_BLOCKED_PARTS = ("sex", "dom", "fem", "tit", "cum", "nig", "fag", "porn", "anal", "rape", "slut", "puss", "kok",
                  "shit", "piss", "bitch", "nazi", "hore", "dik", "fuk", "kil", "dead", "murd", "gay", "nud")


class NameMaker:
    """Draws unique stems from one seeded RNG; `used` guarantees no stem repeats in a world."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def _syllable(self) -> str:
        r = self.rng
        return r.choice(_ONSETS) + r.choice(_VOWELS) + r.choice(_CODAS)

    def stem(self) -> str:
        """A new capitalised word of 5-9 letters that no other name in this world contains as a word."""
        while True:
            word = "".join(self._syllable() for _ in range(self.rng.choice((2, 2, 3))))
            if (5 <= len(word) <= 9 and word not in self.used and word not in _BLOCKED
                    and not any(bad in word for bad in _BLOCKED_PARTS)):
                self.used.add(word)
                return word.capitalize()

    def person(self) -> str:
        return f"{self.stem()} {self.stem()}"

    def work_title(self) -> str:
        s, noun = self.stem(), self.rng.choice(TITLE_NOUNS)
        return self.rng.choice((f"The {noun} of {s}", f"{s}", f"Letters from {s}", f"The {s} {noun}",
                                f"{noun}s of {s}"))

    def organisation(self, kind: str) -> str:
        s = self.stem()
        return self.rng.choice(ORG_NAME_FORMS[kind]).format(s)

    def event(self, suffix: str) -> str:
        return f"{self.stem()} {suffix}"


TITLE_NOUNS = ("Lantern", "Orchard", "Harbour", "Mirror", "Voyage", "Winter", "Garden", "Tower", "Song",
               "Bridge", "Feast", "Shadow", "Candle", "Meadow", "Anchor", "Compass", "Ember", "Falcon")

PROFESSIONS = ("cartographer", "astronomer", "stonemason", "glassblower", "physician", "architect", "botanist",
               "engraver", "clockmaker", "shipwright", "weaver", "apothecary", "surveyor", "bookbinder",
               "lawyer", "merchant", "sculptor", "violinist", "chemist", "diplomat", "engineer", "geologist",
               "tailor", "brewer", "printer", "historian", "mathematician", "potter", "jeweller", "navigator")

# Crafts of the lineages of masters (each is also a profession above).
LINEAGE_CRAFTS = ("glassblower", "stonemason", "weaver", "potter", "clockmaker", "engraver", "bookbinder",
                  "shipwright")

# Organisation kind -> name forms ("{}" is a fresh stem). Kinds that publish a work kind come first.
ORG_NAME_FORMS = {
    "publishing house": ("{} Press", "{} Books"),
    "film studio": ("{} Pictures", "{} Films"),
    "record label": ("{} Records", "{} Sound"),
    "museum": ("{} Museum", "Museum of {}"),
    "trading company": ("{} Trading Company", "{} Works"),
    "university": ("University of {}", "{} College"),
    "guild": ("{} Guild", "Guild of {}"),
    "newspaper": ("{} Courier", "{} Gazette"),
}
ORG_KINDS = tuple(ORG_NAME_FORMS)

# Work kind -> (share of works, the organisation kind that publishes it or "" when none, genres).
WORK_KINDS = {
    "novel": (0.35, "publishing house", ("historical", "comic", "gothic", "pastoral", "epistolary", "adventure",
                                         "detective", "satirical")),
    "film": (0.2, "film studio", ("comedy", "drama", "documentary", "musical", "thriller", "war")),
    "album": (0.2, "record label", ("folk", "jazz", "choral", "orchestral", "dance", "ballad")),
    "painting": (0.25, "", ("landscape", "portrait", "still-life", "allegorical", "seascape", "genre")),
}

# Event name suffix -> kinds an event of that name can be (the kind is stated in its article).
EVENT_KINDS = {"Festival": ("harvest festival", "music festival", "lantern festival"),
               "Fair": ("trade fair", "horse fair", "book fair"),
               "Congress": ("scientific congress", "medical congress", "peace congress"),
               "Tournament": ("chess tournament", "archery tournament", "fencing tournament"),
               "Exhibition": ("art exhibition", "industrial exhibition"),
               "Regatta": ("rowing regatta", "sailing regatta")}

TERRAINS = ("marshland", "highland", "steppe", "forest", "farmland", "moorland", "desert", "tundra")

# Filler words (never facts): what a place or organisation "is known for".
KNOWN_FOR = ("covered markets", "stone bridges", "glassworks", "tiled roofs", "spring fairs", "old libraries",
             "river quays", "clock towers", "salt pans", "rope walks", "bell foundries", "terraced gardens")
PRAISED_FOR = ("vivid characters", "careful structure", "bold colours", "quiet humour", "spare style",
               "unusual ending", "rich detail")
PROGRAMME = ("rowing races", "choir contests", "lectures", "street theatre", "horse shows", "fireworks")
