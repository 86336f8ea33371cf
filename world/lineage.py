"""Lineage questions: "X learned the craft from a master, who learned it from another, and so on.
Who started this line of masters?" — the family whose number of searches grows with N.

A lineage is a chain of people, founder first, each of whose articles states one fact, "P trained
under M" (the founder's: trained under no one). The question names only its start X, the member N-1
steps below the founder, and the answer is the founder, so a reader must open all N articles in
order: X's gives X's master, whose article gives the next master, ..., and the founder's article is
the only one that says the line ends there. N = hops = min_searches; `chain` lists the N pages.

No shortcut: lineage people appear on no other page (World.of_type leaves them out of every other
article), each "trained under" fact is stated only on the pupil's own page, and a lineage's craft is
shared by several lineages, so no search but the chain leads to the founder. Splits are by lineage:
each lineage goes whole to one split (a seeded shuffle cut by the split fractions), so no dev or test
question starts from, passes through or answers with a person of a train question.
"""

from __future__ import annotations

import random

from world.graph import World
from world.phrases import LINEAGE_Q
from world.questions import SPLITS, Question, aliases

DEFAULT_DEPTHS = (2, 4, 8, 16, 32)
MAX_LENGTH = 128


def split_lineages(world: World, fractions: tuple[float, float, float]) -> list[str]:
    """The split of each lineage: a seeded shuffle cut by the fractions; a split with a non-zero
    fraction gets at least one lineage when there are at least three (so dev and test are never empty)."""
    count = len(world.lineages)
    order = list(range(count))
    random.Random(f"hexworld:{world.seed}:split:lineage").shuffle(order)
    sizes = [round(count * f) for f in fractions[1:]]
    if count >= 3:
        sizes = [max(1, n) if f > 0 else n for n, f in zip(sizes, fractions[1:], strict=True)]
    n_dev, n_test = sizes
    out = [""] * count
    for rank, index in enumerate(order):
        out[index] = "test" if rank < n_test else "dev" if rank < n_test + n_dev else "train"
    return out


def make_lineage_questions(world: World, depths: tuple[int, ...], fractions: tuple[float, float, float],
                           progress=None) -> list[Question]:
    """One question per lineage and depth N (<= the lineage's length), ordered train, dev, test and
    shuffled within each split."""
    rng = random.Random(f"hexworld:{world.seed}:lineage-questions")
    split_of = split_lineages(world, fractions)
    made: dict[str, list[Question]] = {split: [] for split in SPLITS}
    for index, members in enumerate(world.lineages):
        people = [world.entities[i] for i in members]
        for n in depths:
            if n > len(people):
                continue
            chain = people[n - 1::-1]  # the start, its master, ..., the founder
            start, founder = chain[0], chain[-1]
            text = rng.choice(LINEAGE_Q).format(x=start.name)
            program = {"sides": [{"start": start.name, "path": []}], "attribute": None, "follow": "trained_under"}
            made[split_of[index]].append(Question(text, founder.name, aliases(world, founder, None), "lineage",
                                                  chain, program, "person", split=split_of[index]))
            if progress:
                progress(1)
    out: list[Question] = []
    for split in SPLITS:
        rng.shuffle(made[split])
        out += made[split]
    return out
