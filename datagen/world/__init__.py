"""The offline world: a seeded fictional encyclopedia with multi-hop questions whose answers are known.

    from datagen.world import generate_world, default_world
    summary = generate_world("runs/world", entities=400, seed=0, max_hops=4)
    folder = default_world(entities=400, seed=0)          # cached under <cache dir>/worlds/

Modules, in the order the generator uses them: `names` (syllable names, vocabularies), `graph`
(entities, functional relations, attributes), `templates` (the wording of every fact), `render`
(articles + which page states which fact), `phrases` + `questions` (bridge and comparison
questions with their evidence chains and splits), `generate` (files, summary, cache), and
`reader` (reads facts back from the text to verify questions). See docs/world.md.
"""

from __future__ import annotations

from pathlib import Path

from datagen.world.generate import (
    FILES,
    GENERATOR_VERSION,
    QA_FILES,
    default_world,
    generate_world,
    work_units,
    world_name,
)

__all__ = ["FILES", "GENERATOR_VERSION", "QA_FILES", "default_world", "generate_world", "resolve_world",
           "work_units", "world_name"]


def resolve_world(cfg) -> Path:
    """The world folder a `WorldConfig` names: `cfg.out` (generated there unless a world with the
    same settings is already there), or the cached default world when `cfg.out` is empty."""
    import json

    settings = {"entities": cfg.entities, "max_hops": cfg.max_hops, "min_hops": cfg.min_hops,
                "short_articles": cfg.short_articles, "questions_per_entity": cfg.questions_per_entity}
    if not cfg.out:
        if list(cfg.splits) != [0.8, 0.1, 0.1]:
            raise ValueError("world.splits other than [0.8, 0.1, 0.1] need an explicit world.out folder")
        return default_world(seed=cfg.seed, **settings)
    out = Path(cfg.out)
    marker = out / "world.json"
    if marker.exists():
        summary = json.loads(marker.read_text(encoding="utf-8"))
        wanted = {**settings, "splits": list(cfg.splits)}
        if (summary.get("version") == GENERATOR_VERSION and summary.get("seed") == cfg.seed
                and summary.get("config") == wanted):
            return out
    generate_world(out, seed=cfg.seed, splits=tuple(cfg.splits), **settings)
    return out
