"""The offline world: a seeded fictional encyclopedia with multi-hop questions whose answers are known.

    from world import generate_world, default_world, resolve_world, with_world_index
    summary = generate_world("runs/world", entities=400, seed=0, max_hops=4)
    folder = default_world(entities=400, seed=0)          # cached under <cache dir>/worlds/

Modules, in the order the generator uses them: `names` (syllable names, vocabularies), `graph`
(entities, functional relations, attributes), `templates` (the wording of every fact), `render`
(articles + which page states which fact), `phrases` + `questions` (bridge and comparison
questions with their evidence chains and splits), `lineage` (questions that need N searches along a
chain of masters), `generate` (files, summary, cache), and
`reader` (reads facts back from the text to verify questions). See docs/world.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from world.config import WorldConfig, WorldToolsConfig
from world.generate import (
    FILES,
    GENERATOR_VERSION,
    QA_FILES,
    default_world,
    generate_world,
    work_units,
    world_name,
)

__all__ = ["FILES", "GENERATOR_VERSION", "QA_FILES", "WorldConfig", "default_world", "generate_world",
           "resolve_world", "tools_world", "unseen_hop_questions", "with_world_index", "work_units", "world_name"]


def resolve_world(cfg: WorldConfig) -> Path:
    """The world folder a `WorldConfig` names: `cfg.out` (generated there unless a world with the
    same settings is already there), or the cached default world when `cfg.out` is empty."""
    import json

    settings = {"entities": cfg.entities, "max_hops": cfg.max_hops, "min_hops": cfg.min_hops,
                "short_articles": cfg.short_articles, "questions_per_entity": cfg.questions_per_entity}
    recorded = dict(settings)  # world.json's "config" for these settings
    if cfg.lineages:
        from world.generate import asked_depths
        from world.lineage import DEFAULT_DEPTHS

        # the default depths are cut to the lineage length (as on the command line); others are taken as given
        depths = None if list(cfg.lineage_depths) == list(DEFAULT_DEPTHS) else list(cfg.lineage_depths)
        settings.update(lineages=cfg.lineages, lineage_length=cfg.lineage_length, lineage_depths=depths)
        recorded.update(lineages=cfg.lineages, lineage_length=cfg.lineage_length,
                        lineage_depths=list(asked_depths(cfg.lineage_length, depths)))
    if not cfg.out:
        if list(cfg.splits) != [0.8, 0.1, 0.1]:
            raise ValueError("world.splits other than [0.8, 0.1, 0.1] need an explicit world.out folder")
        return default_world(seed=cfg.seed, **settings)
    out = Path(cfg.out)
    marker = out / "world.json"
    if marker.exists():
        summary = json.loads(marker.read_text(encoding="utf-8"))
        wanted = {**recorded, "splits": list(cfg.splits)}
        if (summary.get("version") == GENERATOR_VERSION and summary.get("seed") == cfg.seed
                and summary.get("config") == wanted):
            return out
    generate_world(out, seed=cfg.seed, splits=tuple(cfg.splits), **settings)
    return out


def tools_world(cfg: WorldToolsConfig) -> Path | None:
    """The world folder that a config's tools default to, or None: the one rule that train, eval, ask,
    `hexsearch tools` and datagen share. The world is the default exactly when the local search has no
    index of its own (`tools.search_backend: local`, `tools.index_dir` empty); its index is then the
    world's cached index and `access` reads the world's pages. A config that names an index, or searches
    the web, never gets the world behind its back."""
    if cfg.tools.search_backend != "local" or cfg.tools.index_dir:
        return None
    return resolve_world(cfg.world)


W = TypeVar("W", bound=WorldToolsConfig)


def with_world_index(cfg: W) -> tuple[W, Path | None]:
    """(cfg with `tools.index_dir` set to the world's default index when `tools_world(cfg)` applies and
    `search` is configured, the world folder or None). The index is built once, on first use, and cached."""
    from dataclasses import replace

    world = tools_world(cfg)
    if world is None or "search" not in cfg.tools.builtin:
        return cfg, world
    from tools.index import default_index

    return replace(cfg, tools=replace(cfg.tools, index_dir=str(default_index(world)))), world


def unseen_hop_questions(cfg: WorldConfig, split: str = "test") -> list[dict]:
    """The `split`'s bridge and comparison questions of more hops than `cfg.max_hops` (up to the generator's 4),
    for a world that trains on fewer hops than it could ask: how far a policy carries past the hops it saw.

    They come from the same world with `max_hops=4` and no lineages (the cached default world for those
    settings, or `<cfg.out>-hops4` beside an explicit `cfg.out`). Its entities, their articles and the
    split of every start entity are this world's own: they depend on the seed, entity count and splits only,
    and lineages add pages of their own. So no question of this world's other splits starts where one of
    these does. Both claims are checked, not assumed: each row's start entities against this world's other
    splits, and each row by the reader against this world's pages (answerable from its chain alone, every
    chain page needed, no bridge named); a row that fails raises ValueError. Ids get a `-h<hops>` suffix, so
    they never collide with this world's ids."""
    import json
    from dataclasses import replace

    from world.generate import MAX_HOPS
    from world.reader import check_question, read_world

    if cfg.max_hops >= MAX_HOPS:
        return []
    wider = replace(cfg, max_hops=MAX_HOPS, lineages=0, out=f"{cfg.out.rstrip('/')}-hops{MAX_HOPS}" if cfg.out else "")
    lines = (resolve_world(wider) / QA_FILES[split]).read_text(encoding="utf-8").splitlines()
    rows = [r for r in map(json.loads, filter(None, lines))
            if r.get("family") in ("bridge", "comparison") and r["hops"] > cfg.max_hops]
    if rows:
        own = resolve_world(cfg)
        pages, kb, _ = read_world(own)
        elsewhere = {side["start"]: other for other, name in QA_FILES.items() if other != split
                     for line in (own / name).read_text(encoding="utf-8").splitlines() if line
                     for side in json.loads(line)["program"]["sides"]}
        for r in rows:
            missing = [url for url in r["chain"] if url not in pages]
            shared = [f"{side['start']!r} starts a {elsewhere[side['start']]} question of this world"
                      for side in r["program"]["sides"] if side["start"] in elsewhere]
            problems = shared or ([f"chain page {missing[0]} is not in this world"] if missing
                                  else check_question(r, pages, kb))
            if problems:
                raise ValueError(f"unseen-hop question {r['id']} is not held out and sound here: {'; '.join(problems)}")
    return [{**r, "id": f"{r['id']}-h{r['hops']}"} for r in rows]
