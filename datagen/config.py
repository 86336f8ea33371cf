"""Data generation configuration (sections `world` and `datagen`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class WorldConfig:
    out: str = ""
    """Folder of the generated world (corpus.jsonl, pages.jsonl, qa_*.jsonl). Empty: `<cache dir>/worlds/<seed>-<entities>`."""
    entities: int = 400
    """Number of entities in the fictional encyclopedia."""
    seed: int = 0
    """Seed: the same seed always gives byte-identical output."""
    max_hops: int = 4
    """Longest hop chain of a generated question (1-4)."""
    splits: list[float] = field(default_factory=lambda: [0.8, 0.1, 0.1])
    """Train/dev/test fractions of the questions."""


@dataclass
class DatagenConfig:
    out: str = ""
    """Output JSONL of synthesised questions."""
    num_questions: int = 100
    """Questions to synthesise."""
