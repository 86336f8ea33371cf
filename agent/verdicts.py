"""What a judgement is made of: the built-in prompt and its parser, the prompt protocol, the Verdict record and
the persistent VerdictCache (the LLM call itself, its retries and transports are agent/judge.py's LLMJudge).

The built-in prompt asks whether a predicted answer means the same as one of the gold answers and must end
with one line `VERDICT: CORRECT` or `VERDICT: INCORRECT` (a JSON object `{"verdict": "correct"}` is accepted
too; a verdict line naming both is ambiguous): `parse_verdict` reads it, None when it cannot. Verdicts are
cached in SQLite, keyed by a hash of (prompt version, judge model, question, sorted gold answers,
prediction), so a re-run of an evaluation costs no judge calls.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Protocol

from core.log import get_logger

log = get_logger(__name__)

JUDGE_PROMPT_VERSION = "v1"
JUDGE_SYSTEM = "You grade answers to questions. You are strict about facts and lenient about wording."
JUDGE_PROMPT = """\
Question: {question}
Gold answer(s): {gold}
Predicted answer: {prediction}

Does the predicted answer mean the same as one of the gold answers? Differences in wording, \
capitalisation, articles, abbreviations and number formatting do not matter; a different entity, \
date or number, a hedge between several candidates, or a missing answer is incorrect.
Explain briefly, then finish with exactly one line: VERDICT: CORRECT or VERDICT: INCORRECT"""


class JudgePromptLike(Protocol):
    """What LLMJudge needs of a judge prompt (eval.judges.JudgePrompt implements it; agent/ never imports eval/).

    `version` must change whenever the rendered text or the parsing changes: it is part of the cache key.
    Optional attributes `system` and `template` are recorded by `describe()`."""

    name: str
    version: str

    def render(self, question: str, golds: list[str], prediction: str) -> list[dict[str, str]]:
        """The chat messages of one judgement."""
        ...

    def parse(self, text: str) -> bool | None:
        """The verdict in the judge's output: True/False, or None when it cannot be read (never guessed)."""
        ...


RAW_WITHHELD = "(withheld: the judge's output can quote the gold answer of an encrypted suite)"
"""What `Verdict.raw` holds, in memory and in the cache, when the judge keeps no raw output."""

_VERDICT_LINE = re.compile(r"verdict\W*(correct|incorrect)\b", re.IGNORECASE)
_JSON_OBJ = re.compile(r"\{[^{}]*\}")


@dataclass
class Verdict:
    """One judgement."""

    correct: bool | None
    """True/False, or None when no attempt produced a parseable verdict."""
    raw: str
    """The judge's last output (`RAW_WITHHELD` from a judge built with `keep_raw=False`)."""
    cached: bool = False
    attempts: int = 1


def parse_verdict(text: str) -> bool | None:
    """CORRECT -> True, INCORRECT -> False, anything else -> None (the last verdict line wins)."""
    for line in reversed(text.splitlines()):
        found = {v.lower() for v in _VERDICT_LINE.findall(line)}
        if found:
            return None if len(found) > 1 else found == {"correct"}
    for m in reversed(_JSON_OBJ.findall(text)):
        try:
            obj = json.loads(m)
        except ValueError:
            continue
        if isinstance(obj, dict):
            v = str(obj.get("verdict", obj.get("judgement", obj.get("judgment", "")))).strip().lower()
            if v in ("correct", "incorrect"):
                return v == "correct"
    return None


class VerdictCache:
    """SQLite table key -> verdict JSON (thread-safe; one connection per cache; several processes may share
    the file: writers wait for each other, and a cache that stays locked costs a miss, never an episode)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=30.0)
        self._db.execute("CREATE TABLE IF NOT EXISTS verdicts (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        self._db.commit()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(model: str, question: str, golds: list[str], prediction: str,
            prompt_version: str = JUDGE_PROMPT_VERSION) -> str:
        """Hash of (prompt version, judge model, question, sorted golds, prediction)."""
        blob = json.dumps([prompt_version, model, question, sorted(golds), prediction], ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()

    def get(self, key: str) -> Verdict | None:
        """The cached verdict (marked `cached=True`), or None."""
        try:
            with self._lock:
                row = self._db.execute("SELECT value FROM verdicts WHERE key = ?", (key,)).fetchone()
        except sqlite3.OperationalError as e:
            log.warning("judge cache %s unreadable (%s); treating as a miss", self.path, e)
            row = None
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        return Verdict(**{**json.loads(row[0]), "cached": True})

    def put(self, key: str, verdict: Verdict) -> None:
        """Store a verdict (a locked database is logged and skipped)."""
        try:
            with self._lock:
                self._db.execute("INSERT OR REPLACE INTO verdicts VALUES (?, ?)",
                                 (key, json.dumps(asdict(replace(verdict, cached=False)))))
                self._db.commit()
        except sqlite3.OperationalError as e:
            log.warning("judge cache %s not written (%s)", self.path, e)

    def close(self) -> None:
        """Close the database connection."""
        with self._lock:
            self._db.close()
