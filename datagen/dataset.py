"""From finished synthesis items to the dataset: near-duplicate removal, answer-disjoint splits, files.

    encoder = Encoder("minilm")
    summary = write_dataset(items, "runs/dg/data", source="hexsearch-datagen", fractions=(0.8, 0.1, 0.1),
                            seed=0, threshold=0.92, encode=lambda t: encoder.encode(t, kind="query"))

Only accepted items (`status == "accepted"`, see datagen/record.py) become rows. Duplicates are
removed first, because two phrasings of one question in train and test would leak; the splits then
keep every answer entity in one split, because a model that saw "Nampo" as the answer in training
can guess it on a test question about Nampo without searching. The files are `qa.jsonl` (every row,
with its `split`) and `qa_train.jsonl`, `qa_dev.jsonl`, `qa_test.jsonl`, all readable by
`agent.qa.load_qa`, each replaced atomically so a crash never leaves half a file.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agent.rewards import normalize_answer
from core.checkpoint import write_atomic
from datagen.record import qa_row

SPLITS: tuple[str, ...] = ("train", "dev", "test")
Encode = Callable[[list[str]], np.ndarray]
"""Texts -> float array [len(texts), dim] of L2-normalised rows: `Encoder.encode(texts, kind="query")`."""


def normalise_question(q: str) -> str:
    """A question as compared for exact duplicates: SQuAD normalisation (lower-case, no punctuation,
    no articles a/an/the, single spaces), the same as answers get, so "Who founded Stokaim?" and
    "who founded  stokaim" are one question."""
    return normalize_answer(q)


def _order(items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items by their synthesis `index` (position when absent); stable, so equal indexes keep input order."""
    return [item for _, item in sorted(enumerate(items), key=lambda p: (p[1].get("index", p[0]), p[0]))]


def dedupe(items: Sequence[dict[str, Any]], *, threshold: float, encode: Encode | None = None,
           block_size: int = 1024) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(kept, removed): items in `index` order, each kept unless it duplicates an item kept before it.

    An item is an *exact* duplicate when its normalised question and normalised answer both equal a
    kept item's (similarity 1.0). With `encode` and `threshold < 1`, it is an *embedding* duplicate
    when the cosine similarity of its question's embedding with a kept item's is >= `threshold`
    (the answer is ignored: one question with two answers is a contradiction, not two items). The
    earlier item (lower `index`) is kept, so a rerun keeps the same items. Each removed entry is
    {"id", "duplicate_of": id of the most similar kept item, "kind": "exact" | "embedding",
    "similarity"}. Items are compared `block_size` at a time: matrix products against everything kept
    before the block (in chunks, so memory stays bounded), then a small in-block pass, so 100k items
    cost a few hundred GEMMs rather than 100k matrix-vector products over a growing matrix.
    """
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    ordered = _order(items)
    use_embeddings = encode is not None and threshold < 1.0
    kept: list[dict[str, Any]] = []
    removed: list[dict[str, Any]] = []
    kept_keys: dict[tuple[str, str], str] = {}
    kept_vecs: np.ndarray | None = None  # [len(ordered), dim], the first len(kept) rows filled
    for start in range(0, len(ordered), block_size):
        block = ordered[start:start + block_size]
        keys = [(normalise_question(it["question"]), normalize_answer(str(it["answer"]))) for it in block]
        if use_embeddings:
            vecs = _unit_rows(encode([it["question"] for it in block]), len(block))
            if kept_vecs is None:
                kept_vecs = np.zeros((len(ordered), vecs.shape[1]), dtype=np.float32)
            best_before, best_at = _nearest(vecs, kept_vecs[:len(kept)])
            within = vecs @ vecs.T
        kept_here: list[int] = []  # positions in the block of items kept so far
        for j, (item, key) in enumerate(zip(block, keys, strict=True)):
            if key in kept_keys:
                removed.append({"id": item["id"], "duplicate_of": kept_keys[key], "kind": "exact",
                                "similarity": 1.0})
                continue
            if use_embeddings:
                best = float(best_before[j])
                of = kept[best_at[j]]["id"] if best_at[j] >= 0 else ""
                if kept_here:
                    k = int(np.argmax(within[j, kept_here]))
                    if within[j, kept_here[k]] > best:
                        best, of = float(within[j, kept_here[k]]), block[kept_here[k]]["id"]
                if best >= threshold:
                    removed.append({"id": item["id"], "duplicate_of": of, "kind": "embedding",
                                    "similarity": round(best, 6)})
                    continue
                kept_here.append(j)
            kept_keys[key] = item["id"]
            kept.append(item)
        if use_embeddings and kept_here:
            kept_vecs[len(kept) - len(kept_here):len(kept)] = vecs[kept_here]
    return kept, removed


def _nearest(vecs: np.ndarray, kept: np.ndarray, chunk: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    """(best similarity, its row in `kept`) for each row of `vecs`; (-inf, -1) when nothing is kept.
    Goes through `kept` a chunk of rows at a time so the similarity matrix stays [len(vecs), chunk]."""
    best = np.full(len(vecs), -np.inf, dtype=np.float32)
    at = np.full(len(vecs), -1, dtype=np.int64)
    for start in range(0, len(kept), chunk):
        sims = vecs @ kept[start:start + chunk].T
        k = np.argmax(sims, axis=1)
        top = sims[np.arange(len(vecs)), k]
        better = top > best
        best[better], at[better] = top[better], k[better] + start
    return best, at


def _unit_rows(vecs: Any, n: int) -> np.ndarray:
    """`encode`'s output checked for shape and scaled to unit rows, so the dot product is the cosine."""
    vecs = np.asarray(vecs, dtype=np.float32)
    if vecs.ndim != 2 or vecs.shape[0] != n:
        raise ValueError(f"encode returned shape {vecs.shape} for {n} texts; expected ({n}, dim)")
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)
    return vecs / np.maximum(norms, 1e-12)


def split_by_answer(items: Sequence[dict[str, Any]], fractions: Sequence[float] = (0.8, 0.1, 0.1),
                    seed: int = 0) -> dict[str, str]:
    """id -> "train" | "dev" | "test", with no normalised answer in two splits.

    Rule: items are grouped by normalised answer (`normalize_answer`: the answer entity). The group
    keys are sorted, then shuffled with `random.Random(seed)`. Each group in that order goes whole
    to the split whose item count is furthest below its target (`fraction / sum(fractions) * n
    items`; ties go to train, then dev, then test) -- except that once the groups left are no more
    than the non-zero-fraction splits still empty, each goes to the emptiest of those (by the same
    measure), so every split with a non-zero fraction gets at least one group whenever there are at
    least as many groups as such splits. A zero fraction gets nothing. The same items, fractions
    and seed always give the same assignment, whatever the input order.
    """
    if len(fractions) != len(SPLITS) or any(f < 0 for f in fractions) or sum(fractions) <= 0:
        raise ValueError(f"fractions must be {len(SPLITS)} non-negative numbers with a positive sum, "
                         f"got {list(fractions)}")
    groups: dict[str, list[str]] = {}
    for item in items:
        groups.setdefault(normalize_answer(str(item["answer"])), []).append(item["id"])
    ids = [i for members in groups.values() for i in members]
    if len(set(ids)) != len(ids):
        raise ValueError("item ids must be unique")
    order = sorted(groups)
    random.Random(seed).shuffle(order)
    targets = [f / sum(fractions) * len(ids) for f in fractions]
    counts = [0] * len(SPLITS)
    nonzero = [s for s, f in enumerate(fractions) if f > 0]
    empty = list(nonzero)
    assignment: dict[str, str] = {}
    for left, key in zip(range(len(order), 0, -1), order, strict=True):
        pool = empty if left <= len(empty) else nonzero
        s = max(pool, key=lambda i: (targets[i] - counts[i], -i))
        if s in empty:
            empty.remove(s)
        counts[s] += len(groups[key])
        assignment.update(dict.fromkeys(groups[key], SPLITS[s]))
    return assignment


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """Rows as JSONL, replaced atomically: readers see old or new, never half."""
    write_atomic(path, (json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def write_dataset(items: Sequence[dict[str, Any]], out_dir: str | os.PathLike, *, source: str,
                  fractions: Sequence[float], seed: int, threshold: float, encode: Encode | None = None,
                  ) -> dict[str, Any]:
    """Dedupe the accepted items, split them by answer, and write the QA files into `out_dir`.

    Rows are `datagen.record.qa_row(item, source)` plus `"split"`, in `index` order. Returns
    {"accepted": n, "kept": n, "duplicates": [removed entries, as from `dedupe`],
    "splits": {"train": n, "dev": n, "test": n}}.
    """
    accepted = [item for item in items if item.get("status") == "accepted"]
    kept, removed = dedupe(accepted, threshold=threshold, encode=encode)
    split = split_by_answer(kept, fractions, seed)
    rows = [qa_row(item, source) | {"split": split[item["id"]]} for item in kept]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in SPLITS:
        _write_jsonl(out / f"qa_{name}.jsonl", [r for r in rows if r["split"] == name])
    _write_jsonl(out / "qa.jsonl", rows)
    return {"accepted": len(accepted), "kept": len(kept), "duplicates": removed,
            "splits": {name: sum(r["split"] == name for r in rows) for name in SPLITS}}
