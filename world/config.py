"""The `world:` config section."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from core.ranges import ranged
from world.generate import MAX_HOPS
from world.graph import MIN_ENTITIES
from world.lineage import MAX_LENGTH

if TYPE_CHECKING:
    from tools.config import ToolsConfig


@dataclass
class WorldConfig:
    """The offline fictional world (`world`); see docs/world.md for the difficulty dials."""

    out: str = ""
    """Folder of the generated world (corpus.jsonl, pages.jsonl, qa_*.jsonl, world.json). Empty: the cached world under `<cache dir>/worlds/` for these settings."""
    entities: int = ranged(400, ge=MIN_ENTITIES)
    """Number of entities (people, cities, regions, organisations, works, events) in the encyclopedia; at least 20."""
    seed: int = 0
    """Seed: the same seed and settings always give byte-identical files."""
    max_hops: int = ranged(4, ge=1, le=MAX_HOPS)
    """Longest question, in articles a reader must open (1-4). 1 with short_articles is the easy CPU mode."""
    min_hops: int = ranged(1, ge=1, at_most="max_hops")
    """Shortest question, in articles (1..max_hops); raise it for a harder mix."""
    short_articles: bool = False
    """Articles are one lead paragraph with the entity's own facts (no distractor mentions of other entities)."""
    questions_per_entity: float = 3.0
    """Questions to generate per entity (fewer come out when a small world cannot support them)."""
    splits: list[float] = field(default_factory=lambda: [0.8, 0.1, 0.1])
    """Train/dev/test fractions; questions are split by their start entity, so dev/test start from unseen entities."""
    lineages: int = 0
    """Number of lineages of masters for the long-horizon "lineage" questions (0: none, and the world is exactly the one without them)."""
    lineage_length: int = ranged(32, ge=2, le=MAX_LENGTH)
    """People per lineage, founder included (2-128); a lineage question needs up to this many searches."""
    lineage_depths: list[int] = field(default_factory=lambda: [2, 4, 8, 16, 32])
    """The N asked from each lineage (each 2..lineage_length): one question per N, starting N-1 masters below the founder. This default list is cut to lineage_length."""


class WorldToolsConfig(Protocol):
    """The sections of the whole config (hexsearch.config.HexConfig) that pick the default world and its index."""

    world: WorldConfig
    tools: ToolsConfig
