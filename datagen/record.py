"""What one synthesis item records (a line of `items.jsonl`) and what a dataset row keeps of it.

An *item* is one attempt to synthesise a question from one seed page. It is written once, when it
is finished, accepted or rejected; `items.jsonl` is the run's checkpoint (a resumed run skips every
index already there). Accepted items become rows of `qa.jsonl` after near-duplicate removal and
splitting (datagen/dataset.py); rejected ones feed the report (datagen/report.py).

    item = {
      "id": "dg-000042", "index": 42, "seed_url": "...", "status": "accepted" | "rejected",
      "reason": "" | "<stage>: <why>",            # stage: extract | base | fuzz | inject | final | error
      "question": str, "answer": str, "aug_answer": [str],
      "hops": int,                                  # distinct source pages the statements come from
      "pages": [url, ...],                          # source pages, seed first
      "statements": [{"text", "url", "title"}],     # supporting statements of the current question
      "edits": [Edit as dict, ...],                 # every attempted action, accepted or not, in order
      "difficulty": {"correct": k, "attempts": n, "predictions": [str]} | None,   # of the final question
      "search": {"correct": k, "attempts": n, "predictions": [str]} | None,       # optional search check
      "models": {"generator": str, "solver": str, "judge": str},
      "usage": {"calls": int, "prompt_tokens": int, "completion_tokens": int, "cost_usd": float},
      "seconds": float,
    }
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Action = Literal["base", "fuzz", "inject"]
CHECKS: tuple[str, ...] = ("guard", "validity", "difficulty", "uniqueness", "coverage", "search")
"""Check names: `guard` (rule-based: parseable, answer not in the question, one question), `validity`,
`difficulty`, `uniqueness`, `coverage` (inject only: the new fact is not already covered), `search`."""


@dataclass
class Statement:
    """A supporting statement and the page it comes from."""

    text: str
    url: str
    title: str = ""


@dataclass
class CheckResult:
    """One logged check of one edit."""

    name: str
    """One of CHECKS."""
    passed: bool
    reason: str = ""
    """Why it failed (empty when it passed)."""
    detail: dict[str, Any] = field(default_factory=dict)
    """What the check saw: k/n, the alternative answer that fitted, the model's raw verdict, ..."""


@dataclass
class Edit:
    """One attempted action and the checks that judged its result."""

    action: str
    """`base`, or the name of the edit action (datagen.actions.ACTIONS: `fuzz`, `inject`, a user action)."""
    accepted: bool
    question: str = ""
    answer: str = ""
    note: str = ""
    """What the action did: the detail obscured, the page and entity chained in, or why it produced nothing."""
    pages: list[str] = field(default_factory=list)
    """Pages this edit added to the question's sources."""
    checks: list[CheckResult] = field(default_factory=list)

    def failed_check(self) -> CheckResult | None:
        """The first check that failed, if any."""
        return next((c for c in self.checks if not c.passed), None)


def to_dict(obj: Any) -> dict[str, Any]:
    """A record dataclass as plain JSON-ready data."""
    return asdict(obj)


def qa_row(item: dict[str, Any], source: str) -> dict[str, Any]:
    """The `qa.jsonl` row of an accepted item: what `hexsearch train` and `hexsearch eval` read
    (`id`, `question`, `answer`, `aug_answer`, `source`), plus `hops` and the provenance."""
    return {
        "id": item["id"], "question": item["question"], "answer": item["answer"],
        "aug_answer": list(item.get("aug_answer") or []), "source": source, "hops": item["hops"],
        "provenance": {
            "pages": item["pages"], "statements": item["statements"],
            "edits": [{k: e[k] for k in ("action", "accepted", "question", "answer", "note")}
                      | {"checks": [f"{c['name']}:{'pass' if c['passed'] else 'fail'}" for c in e["checks"]]}
                      for e in item["edits"]],
            "difficulty": item.get("difficulty"), "search": item.get("search"), "models": item["models"],
        },
    }
