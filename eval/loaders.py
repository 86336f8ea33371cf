"""Evaluation suites: the files users actually have, read into `agent.qa.QAItem`s.

    data = load_suite("gaia", "metadata.jsonl", limit=50)   # SuiteData(items, skipped, source, encrypted)

Formats, by suite name (`SUITES`):

  xbench      xBench-DeepSearch CSV (`DeepSearch-2505.csv`, `-2510.csv`): `id, prompt, answer,
              reference_steps, canary` (+ other columns, kept in meta). `prompt` and `answer` are
              encrypted: base64 of the UTF-8 text XOR-ed cyclically with the row's canary string
              (key byte i = canary.encode()[i % len]); see eval.crypto. `reference_steps` and
              `canary` are dropped. Only decrypts: a row that does not decrypt is a DataError.
  browsecomp  simple-evals CSV `problem, answer, problem_topic, canary`; `problem`/`answer` are
              base64 of the text XOR-ed with SHA-256(canary) repeated to the length (eval.crypto).
              meta: `topic` (from `problem_topic`).
  gaia        the official validation `metadata.jsonl` (`task_id, Question, Level, Final answer,
              file_name, Annotator Metadata`) or the agent papers' text-only file (`id, task_id,
              Question, answer, Level, Annotator_Metadata`) as a JSON list or JSONL. Tasks with a
              non-empty `file_name` are skipped ("needs attached file x.xlsx"), as are tasks whose
              answer is the hidden-test placeholder "?". meta: `level`, `annotator_metadata`,
              `index` (the text-only file's `id`; the item id is `task_id`).
  frames      google/frames-benchmark `Prompt, Answer, wiki_links, reasoning_types` as CSV/TSV
              (tab-separated when the suffix is .tsv or the header has tabs and no commas) or
              JSONL/JSON list; `question`/`answer` keys are accepted too. meta: `reasoning_types`
              (list, split on "|"), `wiki_links` (list). ids from `id`/`Unnamed: 0`, else `frames-<i>`.
  localqa     FlashRAG / Search-R1 / ASearcher / our JSONL (or JSON list), parsed by
              `agent.qa.parse_qa_row` (the parser behind `load_qa`): `question` + `answer` (str or
              list) / `golden_answers` / `aug_answer`. A Search-R1 (verl) row without `question`
              takes it from the text after the last "Question:" of the user prompt and the answers
              from `reward_model.ground_truth.target`.
  world       the offline world's test split: path None -> the folder of
  world-test  `world.resolve_world(world_config or WorldConfig())`; a world folder -> its
  world-dev   `qa_test.jsonl`; a file -> that file. `world-dev` reads `qa_dev.jsonl`.

JSON files are a list when their first non-blank character is "[", JSONL otherwise (no parquet).
Ids: the row's own id when it has one, else `<suite>-<row index from 0>` (localqa and world:
`<file stem>-<line>`, as `load_qa`). Every item has `meta["source"]` (the suite name unless the
row names its own source).

Errors: a missing file, a missing column or key, a CSV row with the wrong number of fields, bad
JSON, bad base64, text that does not decrypt, a question that is not a non-empty string, a
missing answer or an id used twice raise `agent.qa.DataError` naming the file and where:
`file:line` (CSV: the physical line where the row starts, header = 1; JSONL: the line) or
`file item i` (JSON list, 1-based). CSV and JSONL are streamed; with `limit` reading stops after
N items (counted after skipping), so `skipped` lists only the rows read until then.

Decrypted text lives only in the returned items: loaders write no files. `SuiteData.encrypted`
is True for xbench/browsecomp so callers know not to write questions/answers in clear.
"""

from __future__ import annotations

import ast
import codecs
import csv
import functools
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.qa import ANSWER_KEYS, DataError, QAItem, parse_qa_row
from eval.crypto import decrypt_browsecomp, decrypt_xbench, encrypt_browsecomp, encrypt_xbench

__all__ = ["SUITES", "SuiteData", "decrypt_browsecomp", "decrypt_xbench", "encrypt_browsecomp",
           "encrypt_xbench", "load_browsecomp", "load_frames", "load_gaia", "load_localqa", "load_suite",
           "load_world", "load_xbench"]

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


def _file(path: PathLike) -> Path:
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(f"{path}: " + ("a folder, expected a file" if path.is_dir() else "no such file"))
    return path


def _csv_rows(path: Path, required: Sequence[Sequence[str]], delimiter: str | None = None
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


def _json_rows(path: Path) -> Iterator[tuple[str, int, Any]]:
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


def _object(row: Any, where: str) -> dict:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    return row


def _key(row: dict, names: Sequence[str], where: str, what: str) -> str:
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


def _item(where: str, qid: Any, question: Any, qkey: str, answers: Any, akey: str,
          meta: dict[str, Any]) -> QAItem:
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}: {qkey!r} must be a non-empty string, got {type(question).__name__} "
                        f"{json.dumps(question, ensure_ascii=False)[:60]}")
    golds = _texts(answers, akey, where)
    if not golds:
        raise DataError(f"{where}: {akey!r} is empty")
    if isinstance(qid, bool) or not isinstance(qid, (str, int)) or not str(qid).strip():
        raise DataError(f"{where}: id must be a non-empty string or an integer, got {json.dumps(qid)[:60]}")
    return QAItem(id=str(qid).strip(), question=question.strip(), answers=golds, meta=meta)


class _Collect:
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


def _decrypt(decrypt: Callable[[str, str], str], row: dict[str, str], column: str, where: str) -> str:
    try:
        return decrypt(row[column], row["canary"])
    except ValueError as e:
        raise DataError(f"{where}: column {column!r}: {e}") from None


def _load_encrypted(path: PathLike, limit: int | None, suite: str, decrypt: Callable[[str, str], str],
                    qcol: str, rename: dict[str, str]) -> SuiteData:
    path = _file(path)
    out = _Collect(path, limit, encrypted=True)
    dropped = {"id", qcol, "answer", "canary", "reference_steps", ""}
    for index, (where, row) in enumerate(out.take(_csv_rows(path, [(qcol,), ("answer",), ("canary",)]))):
        question = _decrypt(decrypt, row, qcol, where)
        answer = _decrypt(decrypt, row, "answer", where)
        meta = {rename.get(k, k): v for k, v in row.items() if k not in dropped and v != ""}
        out.add(_item(where, row.get("id") or f"{suite}-{index}", question, qcol, answer, "answer", meta),
                where, suite)
    return out.data


def load_xbench(path: PathLike, *, limit: int | None = None) -> SuiteData:
    """xBench-DeepSearch CSV with encrypted `prompt`/`answer` (XOR with the row's canary, base64)."""
    return _load_encrypted(path, limit, "xbench", decrypt_xbench, "prompt", {})


def load_browsecomp(path: PathLike, *, limit: int | None = None) -> SuiteData:
    """BrowseComp CSV with encrypted `problem`/`answer` (XOR with SHA-256(canary) repeated, base64)."""
    return _load_encrypted(path, limit, "browsecomp", decrypt_browsecomp, "problem", {"problem_topic": "topic"})


GAIA_QUESTION = ("Question", "question")
GAIA_ANSWER = ("Final answer", "Final Answer", "final_answer", "answer")
GAIA_ANNOTATOR = ("Annotator Metadata", "Annotator_Metadata")


def load_gaia(path: PathLike, *, limit: int | None = None) -> SuiteData:
    """GAIA `metadata.jsonl` or the text-only JSON/JSONL; tasks with an attached file are skipped."""
    path = _file(path)
    out = _Collect(path, limit)
    for index, (where, _, raw) in enumerate(out.take(_json_rows(path))):
        row = _object(raw, where)
        qkey = _key(row, GAIA_QUESTION, where, "question")
        akey = _key(row, GAIA_ANSWER, where, "answer")
        qid = next((row[k] for k in ("task_id", "id") if row.get(k) not in (None, "")), f"gaia-{index}")
        file_name = row.get("file_name") or ""
        if not isinstance(file_name, str):
            raise DataError(f"{where}: 'file_name' must be a string, got {type(file_name).__name__}")
        if file_name.strip():
            out.skip(qid, f"needs attached file {file_name.strip()}", where)
            continue
        if row[akey] == "?":
            out.skip(qid, "answer hidden ('?': GAIA test split)", where)
            continue
        used = {qkey, akey, "id", "task_id", "file_name", "file_path", "Level", *GAIA_ANNOTATOR}
        meta: dict[str, Any] = {}
        if "task_id" in row and row.get("id") not in (None, ""):
            meta["index"] = row["id"]  # the text-only file's own numbering
        level = row.get("Level")
        if level is not None:
            meta["level"] = int(level) if str(level).strip().isdigit() else level
        annotator = next((row[k] for k in GAIA_ANNOTATOR if k in row), None)
        if annotator is not None:
            meta["annotator_metadata"] = annotator
        meta.update({k: v for k, v in row.items() if k not in used})
        out.add(_item(where, qid, row[qkey], qkey, row[akey], akey, meta), where, "gaia")
    return out.data


FRAMES_QUESTION = ("Prompt", "prompt", "question", "Question")
FRAMES_ANSWER = ("Answer", "answer", "golden_answers", "answers")
FRAMES_INDEX = ("", "Unnamed: 0")


def _frames_list(key: str, value: Any) -> Any:
    """`reasoning_types` "A | B" -> ["A", "B"]; `wiki_links` "['u1', 'u2']" -> ["u1", "u2"]."""
    if not isinstance(value, str):
        return value
    if key == "reasoning_types":
        return [part.strip() for part in value.split("|") if part.strip()]
    try:
        parsed = ast.literal_eval(value.strip()) if value.strip().startswith("[") else None
    except (ValueError, SyntaxError):
        parsed = None
    return parsed if isinstance(parsed, list) else value


def load_frames(path: PathLike, *, limit: int | None = None) -> SuiteData:
    """FRAMES as CSV/TSV (`Prompt, Answer, wiki_links, reasoning_types`) or JSONL/JSON list."""
    path = _file(path)
    out = _Collect(path, limit)
    if path.suffix.lower() in (".csv", ".tsv"):
        rows: Iterator[tuple[str, Any]] = _csv_rows(path, [FRAMES_QUESTION, FRAMES_ANSWER])
    else:
        rows = ((where, raw) for where, _, raw in _json_rows(path))
    for index, (where, raw) in enumerate(out.take(rows)):
        row = _object(raw, where)
        qkey = _key(row, FRAMES_QUESTION, where, "question")
        akey = _key(row, FRAMES_ANSWER, where, "answer")
        qid: Any = next((row[k] for k in ("id", "qid", "idx", "index", *FRAMES_INDEX)
                         if row.get(k) not in (None, "")), f"frames-{index}")
        meta = {key: _frames_list(key, value) if key in ("reasoning_types", "wiki_links") else value
                for key, value in row.items()  # wikipedia_link_<n> repeat wiki_links
                if key not in (qkey, akey, "id", "qid", "idx", "index", *FRAMES_INDEX)
                and value not in (None, "") and not key.startswith("wikipedia_link_")}
        out.add(_item(where, qid, row[qkey], qkey, row[akey], akey, meta), where, "frames")
    return out.data


def _search_r1_row(row: dict) -> dict:
    """A Search-R1/verl row without `question`: the question from the prompt, answers from the reward."""
    if "question" in row or not isinstance(row.get("prompt"), list):
        return row
    user = [m.get("content") for m in row["prompt"] if isinstance(m, dict) and m.get("role") == "user"]
    if not user or not isinstance(user[-1], str):
        return row
    new = {**row, "question": user[-1].rsplit("Question:", 1)[-1].strip()}
    reward = row.get("reward_model")
    truth = reward.get("ground_truth") if isinstance(reward, dict) else None
    target = truth.get("target") if isinstance(truth, dict) else truth
    if target is not None and not any(k in row for k in ANSWER_KEYS):
        new["golden_answers"] = target
    return new


def load_localqa(path: PathLike, *, limit: int | None = None) -> SuiteData:
    """QA JSONL (or JSON list) in our, ASearcher's, FlashRAG's or Search-R1's shape (see agent.qa)."""
    path = _file(path)
    out = _Collect(path, limit)
    for where, number, raw in out.take(_json_rows(path)):
        row = _search_r1_row(raw) if isinstance(raw, dict) else raw
        out.add(parse_qa_row(row, where, default_id=f"{path.stem}-{number}"), where, "localqa")
    return out.data


def load_world(path: PathLike | None = None, *, limit: int | None = None, split: str = "test",
               world_config: Any = None) -> SuiteData:
    """A split of the offline world: path None -> `resolve_world(world_config or WorldConfig())`
    (generated on first use); a world folder -> its QA file of `split`; a file -> that file."""
    import world

    if split not in world.QA_FILES:
        raise ValueError(f"unknown world split {split!r}; known: {', '.join(world.QA_FILES)}")
    if path is None:
        from world.config import WorldConfig

        path = world.resolve_world(world_config or WorldConfig()) / world.QA_FILES[split]
    elif Path(path).expanduser().is_dir():
        folder = Path(path).expanduser()
        path = folder / world.QA_FILES[split]
        if not path.is_file():
            raise DataError(f"{folder}: no {world.QA_FILES[split]} (not a world folder?)")
    return load_localqa(path, limit=limit)


Loader = Callable[..., SuiteData]

SUITES: dict[str, Loader] = {
    "xbench": load_xbench,
    "gaia": load_gaia,
    "browsecomp": load_browsecomp,
    "frames": load_frames,
    "localqa": load_localqa,
    "world": load_world,
    "world-test": load_world,
    "world-dev": functools.partial(load_world, split="dev"),
}
"""Suite name -> loader(path, *, limit). Only the world suites accept path None."""

PATH_OPTIONAL = frozenset({"world", "world-test", "world-dev"})


def load_suite(suite: str, path: PathLike | None, *, limit: int | None = None,
               world_config: Any = None) -> SuiteData:
    """Read the file of `suite` (a key of `SUITES`, case-insensitive); at most `limit` items.

    `world_config` (a `datagen.config.WorldConfig`, e.g. `cfg.world`) picks the world the world
    suites read when `path` is None; the default is `WorldConfig()`. Other suites ignore it.
    Raises ValueError for an unknown suite or a negative limit, DataError for a missing path or
    file and for any malformed row (naming the file and line).
    """
    name = suite.strip().lower()
    if name not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative integer or None, got {limit!r}")
    if path is None and name not in PATH_OPTIONAL:
        raise DataError(f"suite {name!r} needs a data file")
    if name in PATH_OPTIONAL:
        return SUITES[name](path, limit=limit, world_config=world_config)
    return SUITES[name](path, limit=limit)
