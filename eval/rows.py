"""Reading suite files row by row: the parts every eval-suite loader (eval/loaders.py) shares.

    out = Collect(path, limit)
    for where, row in out.take(csv_rows(path, [("question",), ("answer",)])):
        out.add(make_item(where, row["id"], row["question"], "question", row["answer"], "answer", {}), where, "mine")
    return out.data                                      # SuiteData(items, skipped, source, encrypted)

JSON files are a list when their first non-blank character is "[", JSONL otherwise (no parquet).
CSV is comma-separated, or tab-separated when the suffix is .tsv or the header has tabs and no commas.

Errors: a missing file, a missing column or key, a CSV row with the wrong number of fields, bad
JSON, a question that is not a non-empty string, a missing answer or an id used twice raise
`agent.qa.DataError` naming the file and where: `file:line` (CSV: the physical line where the row
starts, header = 1; JSONL: the line) or `file item i` (JSON list, 1-based). CSV and JSONL are
streamed; with a `limit` reading stops after N items (counted after skipping), so `skipped` lists
only the rows read until then.
"""

from __future__ import annotations

import codecs
import csv
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.qa import DataError, QAItem

PathLike = str | os.PathLike


@dataclass
class SuiteData:
    """The items of one suite file, the rows left out (`{"id", "reason", "where"}`) and the file read."""

    items: list[QAItem]
    skipped: list[dict] = field(default_factory=list)
    source: str = ""
    """The file the items came from."""
    encrypted: bool = False
    """The file was encrypted: do not write its questions or answers anywhere in clear."""


def data_file(path: PathLike) -> Path:
    """`path` as an existing file; DataError saying it is missing or a folder otherwise."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(f"{path}: " + ("a folder, expected a file" if path.is_dir() else "no such file"))
    return path


def csv_rows(path: Path, required: Sequence[Sequence[str]], delimiter: str | None = None
             ) -> Iterator[tuple[str, dict[str, str]]]:
    """(`file:line`, row) for each data row; `required` lists alternatives for each needed column."""
    try:
        yield from _csv_reader(path, required, delimiter)
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text") from None


def _csv_reader(path: Path, required: Sequence[Sequence[str]], delimiter: str | None
                ) -> Iterator[tuple[str, dict[str, str]]]:
    with open(path, encoding="utf-8-sig", newline="") as fh:
        if delimiter is None:
            first = fh.readline()
            delimiter = "\t" if path.suffix.lower() == ".tsv" or ("\t" in first and "," not in first) else ","
            fh.seek(0)
        reader = csv.reader(fh, delimiter=delimiter)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise DataError(f"{path}: empty file, expected a header line") from None
        except csv.Error as e:
            raise DataError(f"{path}:1: not valid CSV ({e})") from None
        for names in required:
            if not any(n in header for n in names):
                raise DataError(f"{path}:1: missing column {' or '.join(repr(n) for n in names)} "
                                f"(columns: {', '.join(header)})")
        while True:
            where = f"{path}:{reader.line_num + 1}"
            try:
                fields = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                raise DataError(f"{where}: not valid CSV ({e})") from None
            if not fields:
                continue  # a blank line
            if len(fields) != len(header):
                raise DataError(f"{where}: {len(fields)} fields, the header has {len(header)} "
                                f"({', '.join(header)})")
            yield where, dict(zip(header, fields, strict=True))


def json_rows(path: Path) -> Iterator[tuple[str, int, Any]]:
    """(where, line or 1-based index, row) of a JSONL file or a file holding one JSON list."""
    with open(path, "rb") as fh:
        fh.seek(3 if fh.read(3) == codecs.BOM_UTF8 else 0)
        first = b" "
        while first.isspace():  # b"" (end of file) is not space
            first = fh.read(1)
        fh.seek(0)
        if first == b"[":
            try:
                data = json.loads(_utf8(fh.read(), path))
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{e.lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
            for i, row in enumerate(data, 1):
                yield f"{path} item {i}", i, row
            return
        for lineno, raw in enumerate(fh, 1):
            line = _utf8(raw, f"{path}:{lineno}")
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
            yield f"{path}:{lineno}", lineno, row


def _utf8(raw: bytes, where: Any) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"{where}: not UTF-8 text (byte {e.start + 1})") from None


def as_object(row: Any, where: str) -> dict:
    """`row` when it is a JSON object; DataError otherwise."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    return row


def first_key(row: dict, names: Sequence[str], where: str, what: str) -> str:
    """The first of `names` present in `row`; DataError when none is."""
    for name in names:
        if name in row:
            return name
    raise DataError(f"{where}: missing {what} {' or '.join(repr(n) for n in names)} "
                    f"(keys: {', '.join(map(str, row)) or 'none'})")


def _texts(value: Any, key: str, where: str) -> list[str]:
    """A string, number or list of those as non-empty stripped strings."""
    out: list[str] = []
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise DataError(f"{where}: {key!r} must be a string or a list of strings, got {type(item).__name__}")
        text = str(item).strip()
        if text and text not in out:
            out.append(text)
    return out


def make_item(where: str, qid: Any, question: Any, qkey: str, answers: Any, akey: str,
              meta: dict[str, Any]) -> QAItem:
    """A QAItem from one row's fields, each checked (`qkey`/`akey`: the row's key names, for messages)."""
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}: {qkey!r} must be a non-empty string, got {type(question).__name__} "
                        f"{json.dumps(question, ensure_ascii=False)[:60]}")
    golds = _texts(answers, akey, where)
    if not golds:
        raise DataError(f"{where}: {akey!r} is empty")
    if isinstance(qid, bool) or not isinstance(qid, (str, int)) or not str(qid).strip():
        raise DataError(f"{where}: id must be a non-empty string or an integer, got {json.dumps(qid)[:60]}")
    return QAItem(id=str(qid).strip(), question=question.strip(), answers=golds, meta=meta)


class Collect:
    """Items and skipped rows of one file, with the limit and the duplicate-id check."""

    def __init__(self, path: Path, limit: int | None, encrypted: bool = False):
        self.data = SuiteData(items=[], skipped=[], source=str(path), encrypted=encrypted)
        self.limit = limit
        self.seen: dict[str, str] = {}

    def take(self, rows: Iterable[Any]) -> Iterator[Any]:
        """`rows` until the limit is reached; the next row is not even read then."""
        it = iter(rows)
        while self.limit is None or len(self.data.items) < self.limit:
            try:
                yield next(it)
            except StopIteration:
                return

    def add(self, item: QAItem, where: str, source: str) -> None:
        if item.id in self.seen:
            raise DataError(f"{where}: id {item.id!r} already used at {self.seen[item.id]}")
        self.seen[item.id] = where
        item.meta.setdefault("source", source)
        self.data.items.append(item)

    def skip(self, qid: Any, reason: str, where: str) -> None:
        self.data.skipped.append({"id": str(qid), "reason": reason, "where": where})
