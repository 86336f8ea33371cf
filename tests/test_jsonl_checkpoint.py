"""Append-only JSONL checkpoints (core/checkpoint.py): a kill can leave the last line without its newline,
parsed or not; resuming must cut it so the next append starts a fresh line, and rows that are not JSON
objects are errors naming the file and line."""

from __future__ import annotations

import pytest

from core.checkpoint import append_row, read_rows


def test_a_last_line_without_newline_is_torn_even_when_it_parses(tmp_path):
    path = tmp_path / "results.jsonl"
    append_row(path, {"id": "q0"})
    with path.open("a") as f:
        f.write('{"id": "q1"}')  # the kill landed between the closing brace and the newline
    assert read_rows(path) == [{"id": "q0"}]  # resume: q1 is redone, not half-kept
    assert path.read_text() == '{"id": "q0"}\n'
    append_row(path, {"id": "q1"})
    append_row(path, {"id": "q2"})
    assert read_rows(path) == [{"id": "q0"}, {"id": "q1"}, {"id": "q2"}]  # resume again: nothing glued


def test_a_torn_line_that_does_not_parse_is_cut_and_appending_goes_on(tmp_path):
    path = tmp_path / "items.jsonl"
    append_row(path, {"id": "a"})
    with path.open("a") as f:
        f.write('{"id": "b", "qu')
    assert read_rows(path) == [{"id": "a"}]
    append_row(path, {"id": "b"})
    assert read_rows(path) == [{"id": "a"}, {"id": "b"}]


@pytest.mark.parametrize("line", ["[1, 2]", "3", '"text"', "null"])
def test_a_row_that_is_not_an_object_is_an_error_naming_file_and_line(tmp_path, line):
    path = tmp_path / "results.jsonl"
    path.write_text('{"id": "q0"}\n' + line + "\n")
    with pytest.raises(ValueError, match=r"results\.jsonl:2: a JSON \w+, not an object"):
        read_rows(path)
    assert path.read_text().endswith(line + "\n")  # an error, never a silent cut of a complete line


def test_a_complete_line_that_is_not_json_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text('{"id": "q0"}\n{"id": \n{"id": "q2"}\n')
    with pytest.raises(ValueError, match=r"results\.jsonl:2: not JSON"):
        read_rows(path)
