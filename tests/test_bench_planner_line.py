"""benchmarks/planner.py's RESULT line says whether its prediction error comes from validation runs made now
or reuses an earlier --validate's (a reused figure must never read as a fresh one)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import planner  # noqa: E402


def test_the_result_line_says_when_it_reuses_an_earlier_validation():
    stored = {"date": "2026-12-05 02:52 UTC", "placements": [{"error": 0.12}]}
    assert planner.validation_token(stored, fresh=False, recomputed=False) == "validation=reused_2026-12-05T02:52Z"
    assert planner.validation_token(stored, fresh=False, recomputed=True) == "validation=recomputed_2026-12-05T02:52Z"
    assert planner.validation_token(stored, fresh=True, recomputed=False) == "validation=fresh"
    assert planner.validation_token({}, fresh=False, recomputed=False) == "validation=none"
    for token in (planner.validation_token(stored, False, False), planner.validation_token({}, False, False)):
        assert " " not in token and token.count("=") == 1  # one key=value token of the RESULT line
