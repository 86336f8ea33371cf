"""The built-in evaluation suites: the files users actually have, read into `agent.qa.QAItem`s.

    data = load_suite("gaia", "metadata.jsonl", limit=50)   # SuiteData(items, skipped, source, encrypted)

Each loader is registered with its suite record (eval/suites.py: default scorers, judge prompt,
encrypted flag) by the `@suite` decorator above it; a new suite is one loader with its decorator.
File reading, ids and errors are shared (eval/rows.py). Formats, by suite name:

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

Ids: the row's own id when it has one, else `<suite>-<row index from 0>` (localqa and world:
`<file stem>-<line>`, as `load_qa`). Every item has `meta["source"]` (the suite name unless the
row names its own source). Bad base64 or text that does not decrypt is a DataError like any
malformed row (eval/rows.py).

Decrypted text lives only in the returned items: loaders write no files. `SuiteData.encrypted`
is True for xbench/browsecomp so callers know not to write questions/answers in clear.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.qa import ANSWER_KEYS, DataError, parse_qa_row
from eval.crypto import decrypt_browsecomp, decrypt_xbench, encrypt_browsecomp, encrypt_xbench
from eval.rows import (
    Collect,
    PathLike,
    SuiteData,
    as_object,
    csv_rows,
    data_file,
    first_key,
    json_rows,
    make_item,
)
from eval.suites import SUITES, load_suite, suite

if TYPE_CHECKING:
    from world.config import WorldConfig

__all__ = ["SUITES", "SuiteData", "decrypt_browsecomp", "decrypt_xbench", "encrypt_browsecomp",
           "encrypt_xbench", "load_browsecomp", "load_frames", "load_gaia", "load_localqa", "load_suite",
           "load_world", "load_world_dev", "load_xbench"]

WORLD_SCORERS = ("em", "f1", "sub_em", "cover_em", "set_f1")
"""Local QA's and the world's scorers: ASearcher's and Search-R1's metrics, exact match first."""

def _decrypt(decrypt: Callable[[str, str], str], row: dict[str, str], column: str, where: str) -> str:
    try:
        return decrypt(row[column], row["canary"])
    except ValueError as e:
        raise DataError(f"{where}: column {column!r}: {e}") from None


def _load_encrypted(path: PathLike, limit: int | None, suite: str, decrypt: Callable[[str, str], str],
                    qcol: str, rename: dict[str, str]) -> SuiteData:
    path = data_file(path)
    out = Collect(path, limit, encrypted=True)
    dropped = {"id", qcol, "answer", "canary", "reference_steps", ""}
    for index, (where, row) in enumerate(out.take(csv_rows(path, [(qcol,), ("answer",), ("canary",)]))):
        question = _decrypt(decrypt, row, qcol, where)
        answer = _decrypt(decrypt, row, "answer", where)
        meta = {rename.get(k, k): v for k, v in row.items() if k not in dropped and v != ""}
        out.add(make_item(where, row.get("id") or f"{suite}-{index}", question, qcol, answer, "answer", meta),
                where, suite)
    return out.data


@suite("xbench", scorers=("em", "f1"), judge="xbench", encrypted=True)
def load_xbench(path: PathLike, *, limit: int | None = None) -> SuiteData:
    """xBench-DeepSearch CSV with encrypted `prompt`/`answer` (XOR with the row's canary, base64)."""
    return _load_encrypted(path, limit, "xbench", decrypt_xbench, "prompt", {})


@suite("browsecomp", scorers=("em", "f1"), judge="browsecomp", encrypted=True)
def load_browsecomp(path: PathLike, *, limit: int | None = None) -> SuiteData:
    """BrowseComp CSV with encrypted `problem`/`answer` (XOR with SHA-256(canary) repeated, base64)."""
    return _load_encrypted(path, limit, "browsecomp", decrypt_browsecomp, "problem", {"problem_topic": "topic"})


GAIA_QUESTION = ("Question", "question")
GAIA_ANSWER = ("Final answer", "Final Answer", "final_answer", "answer")
GAIA_ANNOTATOR = ("Annotator Metadata", "Annotator_Metadata")


@suite("gaia", scorers=("gaia", "em", "f1"), judge="gaia")
def load_gaia(path: PathLike, *, limit: int | None = None) -> SuiteData:
    """GAIA `metadata.jsonl` or the text-only JSON/JSONL; tasks with an attached file are skipped."""
    path = data_file(path)
    out = Collect(path, limit)
    for index, (where, _, raw) in enumerate(out.take(json_rows(path))):
        row = as_object(raw, where)
        qkey = first_key(row, GAIA_QUESTION, where, "question")
        akey = first_key(row, GAIA_ANSWER, where, "answer")
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
        out.add(make_item(where, qid, row[qkey], qkey, row[akey], akey, meta), where, "gaia")
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


@suite("frames", scorers=("em", "f1", "cover_em"), judge="gaia")
def load_frames(path: PathLike, *, limit: int | None = None) -> SuiteData:
    """FRAMES as CSV/TSV (`Prompt, Answer, wiki_links, reasoning_types`) or JSONL/JSON list."""
    path = data_file(path)
    out = Collect(path, limit)
    if path.suffix.lower() in (".csv", ".tsv"):
        rows: Iterator[tuple[str, Any]] = csv_rows(path, [FRAMES_QUESTION, FRAMES_ANSWER])
    else:
        rows = ((where, raw) for where, _, raw in json_rows(path))
    for index, (where, raw) in enumerate(out.take(rows)):
        row = as_object(raw, where)
        qkey = first_key(row, FRAMES_QUESTION, where, "question")
        akey = first_key(row, FRAMES_ANSWER, where, "answer")
        qid: Any = next((row[k] for k in ("id", "qid", "idx", "index", *FRAMES_INDEX)
                         if row.get(k) not in (None, "")), f"frames-{index}")
        meta = {key: _frames_list(key, value) if key in ("reasoning_types", "wiki_links") else value
                for key, value in row.items()  # wikipedia_link_<n> repeat wiki_links
                if key not in (qkey, akey, "id", "qid", "idx", "index", *FRAMES_INDEX)
                and value not in (None, "") and not key.startswith("wikipedia_link_")}
        out.add(make_item(where, qid, row[qkey], qkey, row[akey], akey, meta), where, "frames")
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


@suite("localqa", scorers=WORLD_SCORERS)
def load_localqa(path: PathLike, *, limit: int | None = None) -> SuiteData:
    """QA JSONL (or JSON list) in our, ASearcher's, FlashRAG's or Search-R1's shape (see agent.qa)."""
    path = data_file(path)
    out = Collect(path, limit)
    for where, number, raw in out.take(json_rows(path)):
        row = _search_r1_row(raw) if isinstance(raw, dict) else raw
        out.add(parse_qa_row(row, where, default_id=f"{path.stem}-{number}"), where, "localqa")
    return out.data


@suite("world-test", scorers=WORLD_SCORERS, world=True)
@suite("world", scorers=WORLD_SCORERS, world=True)
def load_world(path: PathLike | None = None, *, limit: int | None = None, split: str = "test",
               world_config: WorldConfig | None = None) -> SuiteData:
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


@suite("world-dev", scorers=WORLD_SCORERS, world=True)
def load_world_dev(path: PathLike | None = None, *, limit: int | None = None, world_config: WorldConfig | None = None) -> SuiteData:
    """The offline world's dev split (`load_world` with split `dev`)."""
    return load_world(path, limit=limit, split="dev", world_config=world_config)
