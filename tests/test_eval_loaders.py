"""Evaluation-suite loaders: every format users have, decryption, errors named by file and line."""

from __future__ import annotations

import base64
import codecs
import csv
import hashlib
import json
from pathlib import Path

import pytest

from agent.qa import DataError
from eval.loaders import (
    SUITES,
    SuiteData,
    decrypt_browsecomp,
    decrypt_xbench,
    encrypt_browsecomp,
    encrypt_xbench,
    load_suite,
)

XB_CANARY = "xbench-canary-test 1234 ÿ"
BC_CANARY = "BENCHMARK DATA SHOULD NEVER APPEAR AS PLAIN TEXT ONLINE. canary GUID test:0000"
ZH_QUESTION = "2019年哪位作家获得了诺贝尔文学奖？请给出最终答案。"
ZH_ANSWER = "彼得·汉德克"


def write_csv(path: Path, header: list[str], rows: list[list[str]], delimiter: str = ",") -> Path:
    with open(path, "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh, delimiter=delimiter)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def write_jsonl(path: Path, *rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in rows),
                    encoding="utf-8")
    return path


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------------
# encryption


@pytest.mark.parametrize("text", ["", "What is 2 + 2?", ZH_QUESTION, "line one\nline two\ttab " * 20])
def test_xbench_round_trip_matches_reference_formula(text):
    enc = encrypt_xbench(text, XB_CANARY)
    assert decrypt_xbench(enc, XB_CANARY) == text
    key = XB_CANARY.encode("utf-8")  # xbench_evals.py: data[i] ^ key_bytes[i % len(key_bytes)]
    data = base64.b64decode(enc)
    assert bytes(data[i] ^ key[i % len(key)] for i in range(len(data))).decode("utf-8") == text


@pytest.mark.parametrize("text", ["", "Who wrote it?", ZH_ANSWER, "x" * 100])
def test_browsecomp_round_trip_matches_reference_formula(text):
    enc = encrypt_browsecomp(text, BC_CANARY)
    assert decrypt_browsecomp(enc, BC_CANARY) == text
    digest = hashlib.sha256(BC_CANARY.encode()).digest()  # browsecomp_eval.py derive_key
    data = base64.b64decode(enc)
    key = digest * (len(data) // len(digest)) + digest[: len(data) % len(digest)]
    assert bytes(a ^ b for a, b in zip(data, key, strict=True)).decode() == text


def xor_b64(data: bytes, key: bytes) -> str:
    """Ciphertext that decrypts (xBench scheme) to arbitrary bytes."""
    return base64.b64encode(bytes(b ^ key[i % len(key)] for i, b in enumerate(data))).decode()


def test_decrypt_errors():
    enc = encrypt_xbench("A question that is long enough to notice a wrong key?", XB_CANARY)
    with pytest.raises(ValueError, match="base64"):
        decrypt_xbench("not base64!!", XB_CANARY)
    with pytest.raises(ValueError, match="not decrypt to UTF-8.*wrong canary"):
        decrypt_xbench(xor_b64(b"\xff\xfe\x80abc", XB_CANARY.encode()), XB_CANARY)
    with pytest.raises(ValueError, match="control characters"):
        decrypt_xbench(encrypt_xbench("a\x01b", XB_CANARY), XB_CANARY)
    assert decrypt_xbench(enc, "another canary") != decrypt_xbench(enc, XB_CANARY)
    with pytest.raises(ValueError, match="empty canary"):
        decrypt_xbench(enc, "")
    assert decrypt_xbench(enc[:8] + "\n" + enc[8:], XB_CANARY).startswith("A question")  # whitespace ignored
    assert encrypt_browsecomp("same", "c1") != encrypt_browsecomp("same", "c2")


# ---------------------------------------------------------------------------------------------
# encrypted suites


def xbench_file(tmp_path: Path, rows: list[tuple[str, str, str]] | None = None) -> Path:
    rows = rows or [("1", ZH_QUESTION, ZH_ANSWER), ("2", "Which river?", "Rhine"), ("3", "Which year?", "1820")]
    body = [[qid, encrypt_xbench(q, XB_CANARY), encrypt_xbench(a, XB_CANARY), "步骤1\n步骤2", XB_CANARY]
            for qid, q, a in rows]
    return write_csv(tmp_path / "DeepSearch.csv", ["id", "prompt", "answer", "reference_steps", "canary"], body)


def test_xbench_csv(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # anything written relative to the working folder would land here
    path = xbench_file(tmp_path)
    before = files_under(tmp_path)
    data = load_suite("xbench", path)
    assert isinstance(data, SuiteData) and data.encrypted and data.source == str(path) and data.skipped == []
    assert [(i.id, i.question, i.answers) for i in data.items] == [
        ("1", ZH_QUESTION, [ZH_ANSWER]), ("2", "Which river?", ["Rhine"]), ("3", "Which year?", ["1820"])]
    assert data.items[0].meta == {"source": "xbench"}  # reference_steps and canary are not kept
    assert files_under(tmp_path) == before  # the loader writes nothing
    for blob in before.values():
        assert ZH_QUESTION.encode() not in blob and ZH_ANSWER.encode() not in blob and b"Rhine" not in blob
    assert [i.id for i in load_suite("XBench", str(path), limit=2).items] == ["1", "2"]


def test_xbench_errors_name_file_and_physical_line(tmp_path):
    path = xbench_file(tmp_path)  # header = line 1, each row spans 2 lines (multi-line reference_steps)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    good = lines[:]
    lines[5] = lines[5].replace(lines[5].split(",")[1], "@@notbase64@@", 1)  # row 3 starts on line 6
    path.write_text("".join(lines), encoding="utf-8")
    with pytest.raises(DataError, match=r"DeepSearch\.csv:6: column 'prompt': not valid base64"):
        load_suite("xbench", path)
    assert len(load_suite("xbench", path, limit=2).items) == 2  # stops before the bad row

    wrong = write_csv(tmp_path / "wrong.csv", ["id", "prompt", "answer", "reference_steps", "canary"],
                      [["1", encrypt_xbench("A question?", XB_CANARY), xor_b64(b"\xc3(", XB_CANARY.encode()),
                        "", XB_CANARY]])
    with pytest.raises(DataError, match=r"wrong\.csv:2: column 'answer': does not decrypt to UTF-8"):
        load_suite("xbench", wrong)

    missing = write_csv(tmp_path / "missing.csv", ["id", "prompt", "answer"], [["1", "a", "b"]])
    with pytest.raises(DataError, match=r"missing\.csv:1: missing column 'canary'"):
        load_suite("xbench", missing)

    empty = write_csv(tmp_path / "empty.csv", ["id", "prompt", "answer", "reference_steps", "canary"],
                      [["1", "YQ==", "YQ==", "", ""]])
    with pytest.raises(DataError, match=r"empty\.csv:2: column 'prompt': empty canary"):
        load_suite("xbench", empty)

    short = tmp_path / "short.csv"
    short.write_text("".join(good[:3]) + "7,abc\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"short\.csv:4: 2 fields, the header has 5"):
        load_suite("xbench", short)


def test_browsecomp_csv(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows = [("Which ship sank first, given clues A and B?", "The Vasa", "History"),
            ("Name the 1990s album with these traits.", "Blue Lines", "Art")]
    path = write_csv(tmp_path / "browse_comp_test_set.csv", ["problem", "answer", "problem_topic", "canary"],
                     [[encrypt_browsecomp(q, BC_CANARY), encrypt_browsecomp(a, BC_CANARY), t, BC_CANARY]
                      for q, a, t in rows])
    before = files_under(tmp_path)
    data = load_suite("browsecomp", path)
    assert data.encrypted
    assert [(i.id, i.question, i.answers, i.meta) for i in data.items] == [
        ("browsecomp-0", rows[0][0], ["The Vasa"], {"topic": "History", "source": "browsecomp"}),
        ("browsecomp-1", rows[1][0], ["Blue Lines"], {"topic": "Art", "source": "browsecomp"})]
    assert files_under(tmp_path) == before
    assert not any(b"The Vasa" in blob or b"Blue Lines" in blob for blob in before.values())

    bad = write_csv(tmp_path / "bad.csv", ["problem", "answer", "problem_topic", "canary"],
                    [[encrypt_browsecomp("ok?", BC_CANARY), encrypt_browsecomp("ok", BC_CANARY), "t", BC_CANARY],
                     [encrypt_browsecomp("ok?", BC_CANARY), "%%%", "t", BC_CANARY]])
    with pytest.raises(DataError, match=r"bad\.csv:3: column 'answer': not valid base64"):
        load_suite("browsecomp", bad)


# ---------------------------------------------------------------------------------------------
# GAIA, Frames


GAIA_ROWS = [
    {"task_id": "t-1", "Question": "How many studio albums?", "Level": 1, "Final answer": "3",
     "file_name": "", "Annotator Metadata": {"Steps": "1. search", "Number of steps": "1"}},
    {"task_id": "t-2", "Question": "What is in the sheet?", "Level": "2", "Final answer": "89706.00",
     "file_name": "7bd855d8.xlsx", "file_path": "2023/validation/7bd855d8.xlsx", "Annotator Metadata": {}},
    {"task_id": "t-3", "Question": "Which city?", "Level": "3", "Final answer": "Saint Petersburg",
     "file_name": "", "Annotator Metadata": {}},
]


def test_gaia_metadata_jsonl_skips_file_tasks(tmp_path):
    path = write_jsonl(tmp_path / "metadata.jsonl", *GAIA_ROWS)
    data = load_suite("gaia", path)
    assert [(i.id, i.question, i.answers, i.meta["level"]) for i in data.items] == [
        ("t-1", "How many studio albums?", ["3"], 1), ("t-3", "Which city?", ["Saint Petersburg"], 3)]
    assert data.items[0].meta["annotator_metadata"]["Number of steps"] == "1"
    assert data.items[0].meta["source"] == "gaia" and "file_name" not in data.items[0].meta
    assert data.skipped == [{"id": "t-2", "reason": "needs attached file 7bd855d8.xlsx", "where": f"{path}:2"}]
    assert not data.encrypted
    limited = load_suite("gaia", path, limit=2)  # the limit counts items after skipping
    assert [i.id for i in limited.items] == ["t-1", "t-3"] and len(limited.skipped) == 1


def test_gaia_text_only_json_list(tmp_path):
    rows = [{"id": i, "task_id": r["task_id"], "Question": r["Question"], "answer": r["Final answer"],
             "Level": r["Level"], "Annotator_Metadata": r["Annotator Metadata"]}
            for i, r in enumerate([GAIA_ROWS[0], GAIA_ROWS[2]])]
    path = tmp_path / "dev.json"
    path.write_text("\n  " + json.dumps(rows, indent=2), encoding="utf-8")
    data = load_suite("gaia", path)
    assert [(i.id, i.answers, i.meta["level"], i.meta["index"]) for i in data.items] == [
        ("t-1", ["3"], 1, 0), ("t-3", ["Saint Petersburg"], 3, 1)]
    assert data.skipped == []
    rows[1]["Question"] = 5
    path.write_text(json.dumps(rows), encoding="utf-8")
    with pytest.raises(DataError, match=r"dev\.json item 2: 'Question' must be a non-empty string, got int 5"):
        load_suite("gaia", path)


def test_gaia_errors(tmp_path):
    path = write_jsonl(tmp_path / "metadata.jsonl", GAIA_ROWS[0], {"task_id": "x", "Question": "Q?"})
    with pytest.raises(DataError, match=r"metadata\.jsonl:2: missing answer 'Final answer'"):
        load_suite("gaia", path)
    path = write_jsonl(tmp_path / "metadata.jsonl", GAIA_ROWS[0], "", '{"task_id": "y", "Question": ')
    with pytest.raises(DataError, match=r"metadata\.jsonl:3: not valid JSON"):
        load_suite("gaia", path)
    path = write_jsonl(tmp_path / "metadata.jsonl", GAIA_ROWS[0], GAIA_ROWS[0])
    with pytest.raises(DataError, match=r"metadata\.jsonl:2: id 't-1' already used at .*:1"):
        load_suite("gaia", path)


FRAMES_HEADER = ["Unnamed: 0", "Prompt", "Answer", "wikipedia_link_1", "reasoning_types", "wiki_links"]
FRAMES_ROWS = [["0", "If my future wife has the same first name as...?", "Jane Ballou", "https://en.wikipedia.org/wiki/A",
                "Numerical reasoning | Multiple constraints", "['https://en.wikipedia.org/wiki/A', 'https://b']"],
               ["1", "Imagine there is a building called\nBronte tower...", "37th", "", "Tabular reasoning", "[]"]]


@pytest.mark.parametrize("name,delimiter", [("frames.csv", ","), ("test.tsv", "\t")])
def test_frames_csv_and_tsv(tmp_path, name, delimiter):
    path = write_csv(tmp_path / name, FRAMES_HEADER, FRAMES_ROWS, delimiter)
    data = load_suite("frames", path)
    first, second = data.items
    assert (first.id, first.answers, second.id, second.answers) == ("0", ["Jane Ballou"], "1", ["37th"])
    assert second.question.startswith("Imagine there is a building called\nBronte")
    assert first.meta == {"reasoning_types": ["Numerical reasoning", "Multiple constraints"],
                          "wiki_links": ["https://en.wikipedia.org/wiki/A", "https://b"], "source": "frames"}
    assert second.meta["wiki_links"] == [] and second.meta["reasoning_types"] == ["Tabular reasoning"]
    bad = write_csv(tmp_path / ("bad" + name), FRAMES_HEADER, [FRAMES_ROWS[1], FRAMES_ROWS[0][:3]], delimiter)
    with pytest.raises(DataError, match=rf"bad{name.replace('.', '[.]')}:4: 3 fields, the header has 6"):
        load_suite("frames", bad)


def test_frames_jsonl_and_agent_json(tmp_path):
    rows = [{"Prompt": "Q one?", "Answer": "A", "reasoning_types": "Temporal reasoning", "wiki_links": ["u"]},
            {"Prompt": "Q two?", "Answer": "B", "reasoning_types": "Numerical reasoning | Temporal reasoning"}]
    data = load_suite("frames", write_jsonl(tmp_path / "frames.jsonl", *rows))
    assert [(i.id, i.question, i.answers) for i in data.items] == [("frames-0", "Q one?", ["A"]),
                                                                   ("frames-1", "Q two?", ["B"])]
    assert data.items[1].meta["reasoning_types"] == ["Numerical reasoning", "Temporal reasoning"]
    agent = tmp_path / "test.json"
    agent.write_text(json.dumps([{"id": "frames_7", "question": "Q?", "answer": ["x", "y"]}]), encoding="utf-8")
    [item] = load_suite("frames", agent).items
    assert (item.id, item.question, item.answers) == ("frames_7", "Q?", ["x", "y"])
    bad = write_jsonl(tmp_path / "bad.jsonl", rows[0], {"Prompt": "Q?", "wiki_links": []})
    with pytest.raises(DataError, match=r"bad\.jsonl:2: missing answer 'Answer' or 'answer'"):
        load_suite("frames", bad)
    bad = write_jsonl(tmp_path / "bad.jsonl", rows[0], ["not", "an", "object"])
    with pytest.raises(DataError, match=r"bad\.jsonl:2: expected a JSON object, got list"):
        load_suite("frames", bad)


# ---------------------------------------------------------------------------------------------
# local QA and the world


def test_localqa_shapes(tmp_path):
    flashrag = {"id": "test_0", "question": "who got the first nobel prize in physics?",
                "golden_answers": ["Wilhelm Conrad Röntgen"], "metadata": {"type": "bridge"}}
    asearcher = {"qid": "q-7", "question": "When?", "answer": ["1820", "the year 1820"], "aug_answer": "1820s",
                 "source": "chain_qa_fuzzy"}
    prompt = "Answer the given question. ... For example, <answer> Beijing </answer>. Question: who sang thriller?\n"
    search_r1 = {"data_source": "nq", "prompt": [{"role": "user", "content": prompt}], "ability": "fact-reasoning",
                 "reward_model": {"style": "rule", "ground_truth": {"target": ["Michael Jackson"]}},
                 "extra_info": {"split": "test", "index": 3}}
    search_r1_full = {**search_r1, "id": "test_4", "question": "who wrote hamlet?", "golden_answers": ["Shakespeare"]}
    path = write_jsonl(tmp_path / "mixed.jsonl", flashrag, asearcher, "", search_r1, search_r1_full)
    data = load_suite("localqa", path)
    ids = [i.id for i in data.items]
    assert ids == ["test_0", "q-7", "mixed-4", "test_4"]
    flash, asr, sr1, sr1_full = data.items
    assert flash.meta == {"metadata": {"type": "bridge"}, "source": "localqa"}
    assert asr.aug_answers == ["1820s"] and asr.meta["source"] == "chain_qa_fuzzy"
    assert (sr1.question, sr1.answers) == ("who sang thriller?", ["Michael Jackson"])
    assert (sr1_full.question, sr1_full.answers) == ("who wrote hamlet?", ["Shakespeare"])
    assert [i.id for i in load_suite("localqa", path, limit=3).items] == ids[:3]
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps([flashrag, {"question": "q?"}]), encoding="utf-8")
    with pytest.raises(DataError, match=r"list\.json item 2: no answer"):
        load_suite("localqa", listed)
    with pytest.raises(DataError, match=r"mixed\.jsonl:2: not valid JSON"):
        load_suite("localqa", write_jsonl(tmp_path / "mixed.jsonl", flashrag, "{oops"))
    with pytest.raises(DataError, match=r"mixed\.jsonl:2: 'question' must be a non-empty string"):
        load_suite("localqa", write_jsonl(tmp_path / "mixed.jsonl", flashrag, {"question": ["q"], "answer": "a"}))


@pytest.fixture(scope="module")
def small_world(tmp_path_factory) -> Path:
    from world import generate_world

    folder = tmp_path_factory.mktemp("world")
    generate_world(folder, entities=30, seed=0, max_hops=2)
    return folder


def test_world_splits(small_world, tmp_path, monkeypatch):
    import world
    from world.config import WorldConfig

    rows = [json.loads(line) for line in open(small_world / "qa_test.jsonl", encoding="utf-8")]
    data = load_suite("world", small_world)
    assert data.source == str(small_world / "qa_test.jsonl") and rows
    assert [(i.id, i.question, i.answers[0]) for i in data.items] == [(r["id"], r["question"], r["answer"])
                                                                    for r in rows]
    assert all(i.meta["source"] == "hexworld" and "hops" in i.meta and "type" in i.meta for i in data.items)
    assert len(load_suite("world", small_world / "qa_test.jsonl", limit=2).items) == 2
    dev = load_suite("world-dev", small_world)
    assert dev.source.endswith("qa_dev.jsonl") and all(i.meta["split"] == "dev" for i in dev.items)

    calls = []
    monkeypatch.setattr(world, "resolve_world", lambda cfg: calls.append(cfg) or small_world)
    assert [i.id for i in load_suite("world", None).items] == [r["id"] for r in rows]
    assert calls == [WorldConfig()]
    mine = WorldConfig(entities=30, max_hops=2, out=str(small_world))
    assert load_suite("world-dev", None, world_config=mine).source == str(small_world / "qa_dev.jsonl")
    assert calls[-1] is mine
    with pytest.raises(DataError, match="not a world folder"):
        load_suite("world", tmp_path)


def test_load_suite_errors(tmp_path):
    assert {"xbench", "gaia", "browsecomp", "frames", "localqa", "world"} <= set(SUITES.names())
    with pytest.raises(ValueError, match=r"eval.suite: unknown eval suite 'hle'. Valid: xbench, browsecomp"):
        load_suite("hle", tmp_path / "x.csv")
    with pytest.raises(DataError, match="needs a data file"):
        load_suite("gaia", None)
    with pytest.raises(DataError, match=r"nothing\.csv: no such file"):
        load_suite("xbench", tmp_path / "nothing.csv")
    with pytest.raises(ValueError, match="limit"):
        load_suite("gaia", tmp_path / "x.jsonl", limit=-1)
    assert load_suite("gaia", write_jsonl(tmp_path / "m.jsonl", *GAIA_ROWS), limit=0).items == []


def test_csv_with_bom_and_crlf_line_endings(tmp_path):
    text = xbench_file(tmp_path).read_text(encoding="utf-8").replace("\r\n", "\n")
    lines = text.split("\n")
    lines[3] = lines[3].replace(lines[3].split(",")[1], "@@", 1)  # row 2 starts on line 4
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode("utf-8"))
    with pytest.raises(DataError, match=r"bom\.csv:4: column 'prompt'"):
        load_suite("xbench", path)
    assert [i.id for i in load_suite("xbench", path, limit=1).items] == ["1"]  # header read despite the BOM


def test_bom_json_list_and_non_utf8(tmp_path):
    path = tmp_path / "gaia.json"
    path.write_bytes(codecs.BOM_UTF8 + b" \n" + json.dumps([GAIA_ROWS[0]]).encode())
    assert [i.id for i in load_suite("gaia", path).items] == ["t-1"]
    path = tmp_path / "qa.jsonl"
    path.write_bytes(codecs.BOM_UTF8 + b'{"question": "q?", "answer": "a"}\n{"question": "\xff", "answer": "b"}\n')
    with pytest.raises(DataError, match=r"qa\.jsonl:2: not UTF-8 text"):
        load_suite("localqa", path)
    assert len(load_suite("localqa", path, limit=1).items) == 1
    bad = tmp_path / "bc.csv"
    bad.write_bytes(b"problem,answer,problem_topic,canary\n\xff,a,b,c\n")
    with pytest.raises(DataError, match=r"bc\.csv: not UTF-8 text"):
        load_suite("browsecomp", bad)
    with pytest.raises(DataError, match="a folder, expected a file"):
        load_suite("frames", tmp_path)
