"""The QA reader: our format, ASearcher's, FlashRAG's; bad rows are named by file and line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.qa import DataError, QAItem, load_qa, parse_qa_row


def write(path: Path, *lines) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines),
                    encoding="utf-8")
    return path


def test_our_format_keeps_aliases_and_metadata(tmp_path):
    row = {"id": "hw0-dev-00001", "question": "Who founded Vorel Press?", "answer": "Kalo Venn",
           "aug_answer": ["Kalo Venn", "Venn"], "hops": 1, "type": "bridge", "split": "dev",
           "chain": ["https://hexwiki.test/wiki/Vorel_Press"], "program": {"sides": []}}
    [item] = load_qa(write(tmp_path / "qa.jsonl", row))
    assert item == QAItem("hw0-dev-00001", "Who founded Vorel Press?", ["Kalo Venn"], ["Kalo Venn", "Venn"],
                          {"hops": 1, "type": "bridge", "split": "dev",
                           "chain": ["https://hexwiki.test/wiki/Vorel_Press"], "program": {"sides": []}})
    again = item.to_dict()
    assert parse_qa_row(again, "x", "d") == item


def test_asearcher_format(tmp_path):
    rows = [{"qid": "q-7", "question": "When?", "answer": ["1820", "the year 1820"], "aug_answer": "1820s",
             "source": "chain_qa_fuzzy"},
            {"query_id": 12, "question": "Where?", "answer": "Tesk"},
            {"idx": 3, "question": "How many?", "answer": 12400}]
    items = load_qa(write(tmp_path / "asearcher.jsonl", *rows))
    assert [i.id for i in items] == ["q-7", "12", "3"]
    assert items[0].answers == ["1820", "the year 1820"] and items[0].aug_answers == ["1820s"]
    assert items[0].meta == {"source": "chain_qa_fuzzy"}
    assert items[2].answers == ["12400"]  # numbers are read as their text


def test_flashrag_format_and_union_of_answer_keys(tmp_path):
    rows = [{"id": "test_0", "question": "who got the first nobel prize in physics?",
             "golden_answers": ["Wilhelm Conrad Röntgen", "Röntgen"], "metadata": {"type": "bridge"}},
            {"id": "test_1", "question": "q?", "answer": "a", "golden_answers": ["a", "b"]}]
    items = load_qa(write(tmp_path / "flashrag.jsonl", *rows))
    assert items[0].answers == ["Wilhelm Conrad Röntgen", "Röntgen"] and items[0].meta == {"metadata": {"type": "bridge"}}
    assert items[1].answers == ["a", "b"]


def test_missing_ids_blank_lines_bom_and_limit(tmp_path):
    path = tmp_path / "plain.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"question": "a?", "answer": "x"}\n\n{"question": "b?", "answer": "y"}\n')
    assert [i.id for i in load_qa(path)] == ["plain-1", "plain-3"]
    assert len(load_qa(path, limit=1)) == 1


def test_json_list_files(tmp_path):
    path = tmp_path / "qa.json"
    path.write_text(json.dumps([{"id": 1, "question": "q?", "answer": "a"}]))
    assert load_qa(path)[0].answers == ["a"]
    path.write_text(json.dumps({"question": "q?"}))
    with pytest.raises(DataError, match="must hold a list"):
        load_qa(path)


@pytest.mark.parametrize("line, problem", [
    ('{"question": "q?", "answer": "a"', "not valid JSON"),
    ('{"answer": "a"}', "missing 'question'"),
    ('{"question": "", "answer": "a"}', "'question' must be a non-empty string"),
    ('{"question": 5, "answer": "a"}', "'question' must be a non-empty string"),
    ('{"question": "q?"}', "no answer"),
    ('{"question": "q?", "answer": []}', "no answer"),
    ('{"question": "q?", "answer": {"text": "a"}}', "'answer' must be a string or a list of strings, got dict"),
    ('{"question": "q?", "golden_answers": ["a", null]}', "'golden_answers' must be a string or a list"),
    ('{"question": "q?", "answer": true}', "got bool"),
    ('{"question": "q?", "answer": "a", "aug_answer": [["x"]]}', "'aug_answer' must be"),
    ('{"question": "q?", "answer": "a", "id": [1]}', "id must be a string or an integer"),
    ('["q?", "a"]', "expected a JSON object, got list"),
])
def test_bad_rows_name_file_line_and_problem(tmp_path, line, problem):
    path = write(tmp_path / "bad.jsonl", {"id": "ok", "question": "fine?", "answer": "yes"}, "", line)
    with pytest.raises(DataError) as e:
        load_qa(path)
    assert str(e.value).startswith(f"{path}:3:") and problem in str(e.value)


def test_duplicate_ids_and_missing_files(tmp_path):
    path = write(tmp_path / "dup.jsonl", {"id": "a", "question": "q?", "answer": "x"},
                 {"id": "a", "question": "r?", "answer": "y"})
    with pytest.raises(DataError, match=r"dup.jsonl:2: id 'a' already used at .*dup.jsonl:1"):
        load_qa(path)
    with pytest.raises(DataError, match="no such QA file"):
        load_qa(tmp_path / "absent.jsonl")


def test_qa_module_imports_nothing_heavy():
    code = ("import sys, agent.qa; heavy = [m for m in ('torch', 'transformers', 'numpy', 'ray', 'faiss') "
            "if m in sys.modules]; print(heavy); sys.exit(1 if heavy else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stdout + done.stderr
