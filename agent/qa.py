"""QA data: one reader for our world's JSONL, ASearcher's and FlashRAG's formats.

    items = load_qa("qa_train.jsonl")        # -> list[QAItem]

Accepted row shapes (one JSON object per line; blank lines are skipped):

    ours / ASearcher   {"id"|"qid"|"query_id"|"idx", "question", "answer": str | [str], "aug_answer"?: str | [str], ...}
    FlashRAG           {"id", "question", "golden_answers": [str], "metadata"?: {...}}

A row may carry both `answer` and `golden_answers`; answers are the union, in order, without
duplicates. Numbers as answers are read as their text ("1820"). Every other key goes to `meta`
(hops, type, chain, split, source, ...). A row without an id gets `<file stem>-<line>`. A bad row
raises `DataError` naming the file, the line and what is wrong; nothing is silently dropped.
This module imports only the standard library, so any process can read QA files cheaply.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ID_KEYS = ("id", "qid", "query_id", "idx")
ANSWER_KEYS = ("answer", "answers", "golden_answers")
AUG_KEYS = ("aug_answer", "aug_answers")


class DataError(ValueError):
    """A data file that cannot be read as QA; the message names the file and line."""


def question_bucket(meta: dict[str, Any]) -> str | None:
    """The difficulty bucket that training, dev evaluation and eval reports break figures down by:
    `n<N>` for a family whose search count grows with a parameter N (the world's `lineage` questions),
    `hops<h>` for bridge and comparison questions (and any row with `hops`), None when the row says
    neither."""
    family, n, hops = meta.get("family"), meta.get("n"), meta.get("hops")
    try:
        if family not in (None, "bridge", "comparison") and n is not None:
            return f"n{int(n)}"
        return None if hops is None else f"hops{int(hops)}"
    except (TypeError, ValueError):  # a foreign file's free-form field: no bucket rather than an error
        return None


_BUCKET_NAME = re.compile(r"(hops|n)(\d+)")


def is_bucket_name(name: str) -> bool:
    """Whether `name` has the form question_bucket gives (`hops<h>`, `n<N>`), whether or not a file has it."""
    return _BUCKET_NAME.fullmatch(name) is not None


def bucket_order(name: str) -> tuple[int, int]:
    """Sort key for bucket names in tables and plots: hops1, hops2, ... then n2, n4, ..., each by its number
    (hops2 before hops10); any other name after them."""
    m = _BUCKET_NAME.fullmatch(name)
    return (2, 0) if m is None else (0 if m.group(1) == "hops" else 1, int(m.group(2)))


@dataclass
class QAItem:
    """One question with its accepted answers."""

    id: str
    question: str
    answers: list[str]
    aug_answers: list[str] = field(default_factory=list)
    """Alternative answers (ASearcher's `aug_answer`), scored with a smaller weight."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Every other key of the row (hops, type, chain, split, source, metadata, ...)."""

    def to_dict(self) -> dict[str, Any]:
        """The row in our format (`answer` is the first answer, the rest are kept as `answers`)."""
        row = {**self.meta, "id": self.id, "question": self.question, "answer": self.answers[0]}
        if len(self.answers) > 1:
            row["answers"] = list(self.answers)
        if self.aug_answers:
            row["aug_answer"] = list(self.aug_answers)
        return row


def _texts(value: Any, key: str, where: str) -> list[str]:
    """A str, number or list of those as a list of non-empty strings; anything else is an error."""
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise DataError(f"{where}: '{key}' must be a string or a list of strings, got "
                            f"{type(item).__name__} {json.dumps(item)[:60]}")
        text = str(item).strip()
        if text:
            out.append(text)
    return out


def parse_qa_row(row: Any, where: str, default_id: str) -> QAItem:
    """One decoded row as a QAItem; `where` ("file:line") prefixes every error message."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    question = row.get("question")
    if question is None:
        raise DataError(f"{where}: missing 'question' (keys: {', '.join(sorted(row)) or 'none'})")
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}: 'question' must be a non-empty string, got {json.dumps(question)[:60]}")
    answers: list[str] = []
    for key in ANSWER_KEYS:
        if key in row:
            answers += [a for a in _texts(row[key], key, where) if a not in answers]
    if not answers:
        keys = " or ".join(f"'{k}'" for k in ANSWER_KEYS)
        raise DataError(f"{where}: no answer: needs a non-empty {keys}")
    aug: list[str] = []
    for key in AUG_KEYS:
        if key in row and row[key] is not None:
            aug += [a for a in _texts(row[key], key, where) if a not in aug]
    qid = next((row[k] for k in ID_KEYS if row.get(k) is not None), default_id)
    if isinstance(qid, bool) or not isinstance(qid, (str, int)):
        raise DataError(f"{where}: id must be a string or an integer, got {json.dumps(qid)[:60]}")
    used = {"question", *ANSWER_KEYS, *AUG_KEYS, *ID_KEYS}
    meta = {k: v for k, v in row.items() if k not in used}
    return QAItem(id=str(qid), question=question.strip(), answers=answers, aug_answers=aug, meta=meta)


def load_qa(path: str | os.PathLike, limit: int | None = None) -> list[QAItem]:
    """Read a QA JSONL file (or a .json file holding a list of rows); at most `limit` items.

    Raises DataError for a missing file, a line that is not JSON, a row without a question or an
    answer, a value of the wrong type, or an id used twice.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such QA file")
    rows: list[tuple[str, int, Any]] = []
    with open(path, encoding="utf-8-sig") as fh:
        if path.suffix == ".json":
            try:
                data = json.load(fh)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{e.lineno}: not valid JSON: {e.msg}") from e
            if not isinstance(data, list):
                raise DataError(f"{path}: a .json QA file must hold a list of rows, got {type(data).__name__}")
            rows = [(f"{path} item {i}", i, row) for i, row in enumerate(data, 1)]
        else:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rows.append((f"{path}:{lineno}", lineno, json.loads(line)))
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno})") from e
                if limit is not None and len(rows) >= limit:
                    break
    items: list[QAItem] = []
    first_seen: dict[str, str] = {}
    for where, number, row in rows[:limit]:
        item = parse_qa_row(row, where, default_id=f"{path.stem}-{number}")
        if item.id in first_seen:
            raise DataError(f"{where}: id {item.id!r} already used at {first_seen[item.id]}")
        first_seen[item.id] = where
        items.append(item)
    return items
