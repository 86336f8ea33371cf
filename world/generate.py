"""Generate a world folder: corpus.jsonl, pages.jsonl, qa_{train,dev,test}.jsonl, world.json.

Deterministic by construction: every random choice comes from a `random.Random` seeded with a
string derived from the world seed, iteration is over lists in id order (never sets), JSON is
written with sorted keys and no time stamps, so the same arguments give byte-identical files.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from core.checkpoint import write_atomic
from world.graph import BASE_URL, MIN_ENTITIES, TYPES, build_graph
from world.lineage import DEFAULT_DEPTHS, MAX_LENGTH, make_lineage_questions
from world.questions import SPLITS, make_questions
from world.render import render_page

GENERATOR_VERSION = "2"
"""Bumped whenever the same seed would produce different files (cached worlds are keyed by it).
2: every QA row has `family`, `n` and `min_searches` (pages and questions are as in 1)."""
QA_FILES = {split: f"qa_{split}.jsonl" for split in SPLITS}
FILES = ("corpus.jsonl", "pages.jsonl", *QA_FILES.values(), "world.json")
MAX_HOPS = 4

Progress = Callable[[int, str], None]
"""progress(units_done, stage): called as work completes; see `work_units` for the total."""


def work_units(entities: int, questions_per_entity: float = 3.0, lineages: int = 0, lineage_length: int = 32,
               lineage_depths: Sequence[int] | None = None) -> int:
    """Total progress units of one generation (build + render per entity, one per question)."""
    depths = asked_depths(lineage_length, lineage_depths)
    return (2 * (entities + lineages * lineage_length) + round(questions_per_entity * entities)
            + lineages * sum(d <= lineage_length for d in depths))


def asked_depths(lineage_length: int, lineage_depths: Sequence[int] | None) -> tuple[int, ...]:
    """The depths asked: as given, or by default those of DEFAULT_DEPTHS that fit the lineages."""
    if lineage_depths is None:
        return tuple(d for d in DEFAULT_DEPTHS if d <= lineage_length)
    return tuple(lineage_depths)


def _check(entities: int, max_hops: int, min_hops: int, splits: Sequence[float], questions_per_entity: float,
           lineages: int = 0, lineage_length: int = 32, lineage_depths: Sequence[int] = DEFAULT_DEPTHS) -> None:
    if entities < MIN_ENTITIES:
        raise ValueError(f"entities must be at least {MIN_ENTITIES}, got {entities}")
    if not 1 <= max_hops <= MAX_HOPS:
        raise ValueError(f"max_hops must be between 1 and {MAX_HOPS}, got {max_hops}")
    if not 1 <= min_hops <= max_hops:
        raise ValueError(f"min_hops must be between 1 and max_hops={max_hops}, got {min_hops}")
    if len(splits) != 3 or any(f < 0 for f in splits) or abs(sum(splits) - 1) > 1e-6:
        raise ValueError(f"splits must be three non-negative fractions (train, dev, test) summing to 1, got {list(splits)}")
    if questions_per_entity <= 0:
        raise ValueError(f"questions_per_entity must be positive, got {questions_per_entity}")
    if lineages < 0:
        raise ValueError(f"lineages must be 0 (none) or more, got {lineages}")
    if not 2 <= lineage_length <= MAX_LENGTH:
        raise ValueError(f"lineage_length must be between 2 and {MAX_LENGTH} (people per lineage), got {lineage_length}")
    if lineages and not lineage_depths:
        raise ValueError("lineage_depths must name at least one N when lineages > 0")
    for depth in lineage_depths if lineages else ():
        if not 2 <= depth <= lineage_length:
            raise ValueError(f"lineage_depths: {depth} must be between 2 and lineage_length={lineage_length} "
                             f"(a question of N needs a lineage of at least N people), got {list(lineage_depths)}")
    if len(set(lineage_depths)) != len(lineage_depths):
        raise ValueError(f"lineage_depths must not repeat a depth, got {list(lineage_depths)}")


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    write_atomic(path, (json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n" for row in rows))


def generate_world(out_dir: str | os.PathLike, entities: int = 400, seed: int = 0, max_hops: int = 4,
                   splits: Sequence[float] = (0.8, 0.1, 0.1), *, min_hops: int = 1, short_articles: bool = False,
                   questions_per_entity: float = 3.0, lineages: int = 0, lineage_length: int = 32,
                   lineage_depths: Sequence[int] | None = None, progress: Progress | None = None) -> dict:
    """Write a world into `out_dir` (created if missing; world files replaced) and return its summary.

    `max_hops`/`min_hops` bound the hop count of questions; `short_articles` keeps only each
    article's lead paragraph (no distractors). `max_hops=1, short_articles=True` is the easy mode
    for CPU-scale RL. `lineages` lineages of `lineage_length` masters add one lineage question per
    depth N in `lineage_depths` (default: 2, 4, 8, 16, 32 up to the length) from each lineage; with 0
    the world is exactly the one without them. Raises ValueError for arguments out of range.
    """
    depths = asked_depths(lineage_length, lineage_depths)
    _check(entities, max_hops, min_hops, splits, questions_per_entity, lineages, lineage_length, depths)
    tick = progress or (lambda n, stage: None)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    world = build_graph(entities, seed, lineages, lineage_length)
    tick(len(world.entities), "building the world")
    pages = []
    for e in world.entities:
        pages.append(render_page(world, e, short=short_articles))
        tick(1, "writing articles")
    stated_by: dict[tuple[int, str], set[int]] = {}
    for page in pages:
        for key in page.facts:
            stated_by.setdefault(key, set()).add(page.entity.id)
    target = round(questions_per_entity * entities)
    questions = make_questions(world, stated_by, target, min_hops, max_hops, tuple(splits),
                               progress=lambda n: tick(n, "asking questions"))
    questions += make_lineage_questions(world, depths, tuple(splits), progress=lambda n: tick(n, "asking questions"))
    tick(max(0, target - len(questions)), "writing files")

    passages = []
    for page in pages:
        for text in page.paragraphs:
            passages.append({"id": str(len(passages)), "title": page.entity.name, "url": page.entity.url,
                             "contents": f'"{page.entity.name}"\n{text}'})
    _write_jsonl(out / "corpus.jsonl", passages)
    _write_jsonl(out / "pages.jsonl", [{"url": p.entity.url, "contents": p.contents} for p in pages])
    counters = {split: 0 for split in SPLITS}
    rows: dict[str, list[dict]] = {split: [] for split in SPLITS}
    for q in questions:
        counters[q.split] += 1
        rows[q.split].append({
            "id": f"hw{seed}-{q.split}-{counters[q.split]:05d}", "question": q.question, "answer": q.answer,
            "aug_answer": q.aliases, "hops": q.hops, "type": q.qtype, "chain": [e.url for e in q.chain],
            "split": q.split, "source": "hexworld", "answer_type": q.answer_type, "program": q.program,
            **q.row_fields()})
    for split in SPLITS:
        _write_jsonl(out / QA_FILES[split], rows[split])

    summary = {
        "generator": "hexsearch.world", "version": GENERATOR_VERSION, "seed": seed, "base_url": BASE_URL,
        "config": {"entities": entities, "max_hops": max_hops, "min_hops": min_hops, "splits": list(splits),
                   "short_articles": short_articles, "questions_per_entity": questions_per_entity,
                   **_lineage_settings(lineages, lineage_length, depths)},
        "entities": {t: len(world.of_type(t)) for t in TYPES},
        **({"lineage_people": sum(map(len, world.lineages))} if lineages else {}),
        "pages": len(pages), "passages": len(passages), "facts": sum(len(p.facts) for p in pages),
        "questions": _question_counts(questions), "files": list(FILES),
    }
    write_atomic(out / "world.json", json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary


def _question_counts(questions) -> dict:
    def count(key) -> dict[str, int]:
        return {str(k): v for k, v in sorted(Counter(key(q) for q in questions).items())}

    return {"total": len(questions), "by_hops": count(lambda q: q.hops), "by_type": count(lambda q: q.qtype),
            "by_split": count(lambda q: q.split), "by_answer_type": count(lambda q: q.answer_type),
            "by_hops_type": count(lambda q: f"{q.hops}-{q.qtype}"), "by_family": count(lambda q: q.qtype),
            "by_family_n": {f"{family}-{n}": v for (family, n), v in  # numeric order of n in each family
                            sorted(Counter((q.qtype, q.hops) for q in questions).items())}}


def _lineage_settings(lineages: int, lineage_length: int, depths: Sequence[int]) -> dict:
    """The lineage settings as world.json records them: none at all without lineages, so such a world's
    summary is the one a generator without lineages writes."""
    if not lineages:
        return {}
    return {"lineages": lineages, "lineage_length": lineage_length, "lineage_depths": list(depths)}


def world_name(entities: int, seed: int, max_hops: int, short_articles: bool = False, min_hops: int = 1,
               questions_per_entity: float = 3.0, lineages: int = 0, lineage_length: int = 32,
               lineage_depths: Sequence[int] | None = None) -> str:
    """Folder name of a cached world (includes the generator version, so stale caches are not reused)."""
    name = f"v{GENERATOR_VERSION}-s{seed}-n{entities}-h{max_hops}"
    name += f"-min{min_hops}" if min_hops != 1 else ""
    name += f"-q{questions_per_entity:g}" if questions_per_entity != 3.0 else ""
    if lineages:
        depths = asked_depths(lineage_length, lineage_depths)
        name += f"-lin{lineages}x{lineage_length}"
        name += "-d" + ".".join(map(str, depths)) if depths != asked_depths(lineage_length, None) else ""
    return name + ("-short" if short_articles else "")


def default_world(entities: int = 400, seed: int = 0, max_hops: int = 4, short_articles: bool = False, *,
                  min_hops: int = 1, questions_per_entity: float = 3.0, lineages: int = 0, lineage_length: int = 32,
                  lineage_depths: Sequence[int] | None = None) -> Path:
    """The cached world folder for these settings under `<cache dir>/worlds/`, generated on first use.

    Generation happens in a temporary folder that is renamed into place, so a crash or a
    concurrent caller never sees half a world; if two processes race, the first rename wins.
    """
    from serving.models import cache_dir

    root = cache_dir() / "worlds"
    lineage = {"lineages": lineages, "lineage_length": lineage_length, "lineage_depths": lineage_depths}
    _check(entities, max_hops, min_hops, (0.8, 0.1, 0.1), questions_per_entity, lineages, lineage_length,
           asked_depths(lineage_length, lineage_depths))
    final = root / world_name(entities, seed, max_hops, short_articles, min_hops, questions_per_entity, **lineage)
    if (final / "world.json").exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
    try:
        generate_world(tmp, entities=entities, seed=seed, max_hops=max_hops, short_articles=short_articles,
                       min_hops=min_hops, questions_per_entity=questions_per_entity, **lineage)
        if final.exists() and not (final / "world.json").exists():
            shutil.rmtree(final)  # a leftover without its completion marker
        try:
            os.replace(tmp, final)
        except OSError:
            if not (final / "world.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
