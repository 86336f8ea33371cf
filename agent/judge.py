"""LLM-as-judge served by any InferenceEngine, with parsed verdicts and a persistent cache.

The judge is asked whether a predicted answer means the same as one of the gold answers and must
end with one line `VERDICT: CORRECT` or `VERDICT: INCORRECT` (a JSON object `{"verdict": "correct"}` is accepted
too; a verdict line naming both is ambiguous). Anything else is recorded as unparseable
(`Verdict.correct is None`), retried up to `retries` times with a new seed, and scored 0 by the
reward, never guessed. Verdicts are cached in SQLite, keyed by a hash of (prompt version, judge
model, question, sorted gold answers, prediction), so a re-run of an evaluation costs no judge calls.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import sqlite3
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from serving.protocol import GenerateRequest, InferenceEngine, SamplingParams, generate_continuing

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

_VERDICT_LINE = re.compile(r"verdict\W*(correct|incorrect)\b", re.IGNORECASE)
_JSON_OBJ = re.compile(r"\{[^{}]*\}")


@dataclass
class Verdict:
    """One judgement."""

    correct: bool | None
    """True/False, or None when no attempt produced a parseable verdict."""
    raw: str
    """The judge's last output."""
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
    """SQLite table key -> verdict JSON (thread-safe; one connection per cache)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False)
        self._db.execute("CREATE TABLE IF NOT EXISTS verdicts (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        self._db.commit()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(model: str, question: str, golds: list[str], prediction: str) -> str:
        blob = json.dumps([JUDGE_PROMPT_VERSION, model, question, sorted(golds), prediction], ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()

    def get(self, key: str) -> Verdict | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM verdicts WHERE key = ?", (key,)).fetchone()
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        return Verdict(**{**json.loads(row[0]), "cached": True})

    def put(self, key: str, verdict: Verdict) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO verdicts VALUES (?, ?)", (key, json.dumps(asdict(verdict))))
            self._db.commit()

    def close(self) -> None:
        self._db.close()


class LLMJudge:
    """Judges predictions with any InferenceEngine (embedded, HTTP, vLLM, SGLang, scripted)."""

    def __init__(self, engine: InferenceEngine, model_name: str, *, cache: VerdictCache | str | Path | None = None,
                 max_new_tokens: int = 256, temperature: float = 0.0, retries: int = 2, max_prediction_chars: int = 500):
        self.engine = engine
        self.model_name = model_name
        self.cache = VerdictCache(cache) if isinstance(cache, (str, Path)) else cache
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.retries = retries
        self.max_prediction_chars = max_prediction_chars
        self.calls = 0

    @classmethod
    def from_config(cls, engine: InferenceEngine, model_name: str, config: Any) -> LLMJudge:
        """A judge whose cache is `config.judge_cache` (an AgentConfig), default `<cache dir>/judge.sqlite`."""
        path = getattr(config, "judge_cache", "") or None
        if path is None:
            from serving.models import cache_dir

            path = cache_dir() / "judge.sqlite"
        return cls(engine, model_name, cache=path)

    def prompt_ids(self, question: str, golds: list[str], prediction: str) -> list[int]:
        tok = self.engine.tokenizer
        user = JUDGE_PROMPT.format(question=question, gold=" | ".join(golds) or "(none)",
                                   prediction=prediction[: self.max_prediction_chars] or "(no answer)")
        messages = [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        else:
            text = f"{JUDGE_SYSTEM}\n\n{user}\n"
        return tok.encode(text, add_special_tokens=False)

    async def judge(self, question: str, golds: list[str], prediction: str) -> Verdict:
        """The verdict for one prediction (from the cache when known)."""
        key = VerdictCache.key(self.model_name, question, list(golds), prediction)
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                return hit
        ids = self.prompt_ids(question, list(golds), prediction)
        raw, verdict = "", None
        attempt = 0
        for attempt in range(1, self.retries + 2):
            sp = SamplingParams(temperature=self.temperature if attempt == 1 else max(self.temperature, 0.7),
                                max_new_tokens=self.max_new_tokens, seed=attempt)
            out = await generate_continuing(self.engine, GenerateRequest(prompt_ids=ids, sampling=sp))
            self.calls += 1
            raw = self.engine.tokenizer.decode(out.output_ids, skip_special_tokens=True)
            verdict = parse_verdict(raw)
            if verdict is not None:
                break
        result = Verdict(verdict, raw, attempts=attempt)
        if self.cache is not None and verdict is not None:
            self.cache.put(key, result)
        return result

    async def judge_many(self, items: list[tuple[str, list[str], str]], concurrency: int = 16) -> list[Verdict]:
        """Judge many (question, golds, prediction) triples with bounded concurrency."""
        sem = asyncio.Semaphore(concurrency)

        async def one(item: tuple[str, list[str], str]) -> Verdict:
            async with sem:
                return await self.judge(*item)

        return list(await asyncio.gather(*(one(i) for i in items)))


def judge_info(verdict: Verdict) -> dict[str, Any]:
    """What a trajectory's reward_info records about a verdict."""
    return {"judge": verdict.correct, "judge_parsed": verdict.correct is not None, "judge_cached": verdict.cached,
            "judge_attempts": verdict.attempts, "judge_raw": verdict.raw[-300:]}
