"""The benchmarks' published LLM-judge prompts, as `JudgePrompt`s that agent.judge.LLMJudge accepts.

A JudgePrompt is a template plus the parser of its required output format:
`render(question, golds, prediction) -> chat messages` and `parse(text) -> True | False | None`, where
None means the output could not be read: LLMJudge retries it and scores it 0, never guesses it correct.
Each prompt's `version` is its name plus a hash of everything that shapes the verdict (system text,
template, truncation, parser and its revision), computed at import, so any edit changes the cache key.

The templates are the published ones, verbatim, with their own placeholders ({question} and one of
{correct_answer}/{gt_answer}/{gold} and {response}/{pred_answer}/{prediction}). Official suites have one
gold answer per question; several aliases are joined with " | " (ASearcher: the Python list, as it passes
its `gt` list to `str.format`). The four published prompts have no system message: one user message.

- `xbench` — xBench-DeepSearch `LLM_JUDGE_PROMPT` (xbench-ai/xbench-evals `eval_grader.py`, Chinese):
  the judge writes `最终答案:` (extracted answer or 无), `解释:` and `结论: 正确|错误`; a small numeric
  error is acceptable. Parse: the last `结论` line; its value must begin with 正确 (True) or 错误/不正确
  (False). (The official regex `结论:*.(正确|错误)` would read "结论:不正确" as 正确; here it is False.)
  xBench also skips the judge when the response's `最终答案:` equals the gold exactly: `xbench_direct_match`.
- `browsecomp` — the HLE grader template used by BrowseComp (openai/simple-evals `browsecomp_eval.py`):
  `extracted_final_answer:`, `reasoning:`, `correct: yes|no` ("or is within a small margin of error for
  numerical problems"), `confidence:` (100 when absent). Parse: lines `correct: (yes|no)` (case and
  markdown tolerated); none, or lines that disagree -> None. `browsecomp_confidence` reads the confidence.
- `gaia` — the GAIA-text-103 judge of WebAgent / Tongyi DeepResearch / MiroThinker (`JUDGE_PROMPT_GAIA`):
  answer "Correct" or "Incorrect", no other text. Parse: the whole reply, else its last non-empty line,
  must be exactly Correct/Incorrect (case, markdown, quotes and a final period tolerated).
- `asearcher` — ASearcher's `DefaultJudge` (`evaluation/evaluate.py`): JSON `{"rationale", "judgement":
  "Correct"|"Incorrect"}` in a ```json block; the prediction is cut to 500 characters. Parse as ASearcher's
  `cal_metrics`: the block after the last ```json through json.loads then ast.literal_eval (literals only:
  nothing is executed), else the substrings `"judgement": "incorrect"` / `"judgement": "correct"`.
  A parsed object whose judgement is neither correct nor incorrect is None here (ASearcher: False).
- `default` — our built-in prompt (agent.judge: `VERDICT: CORRECT|INCORRECT`), version "v1" exactly as
  LLMJudge uses it without a prompt, so training and evaluation share cached verdicts.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.verdicts import JUDGE_PROMPT, JUDGE_PROMPT_VERSION, JUDGE_SYSTEM, parse_verdict
from core.registry import ComponentError, Registry

Parser = Callable[[str], "bool | None"]

JUDGE_PROMPTS = Registry("judge prompt", "eval.judge")
"""Judge prompts by name (`eval.judge`; `pkg.mod:attr` names a user prompt: any agent.judge.JudgePromptLike)."""


def join_golds(golds: Sequence[str]) -> str:
    """Gold aliases as one string: the answer itself when there is one, else joined with " | "."""
    return " | ".join(golds)


def python_list_golds(golds: Sequence[str]) -> str:
    """ASearcher's rendering: the single answer, or `str(list)` for several (what its `.format(gt_answer=gt)` does)."""
    return golds[0] if len(golds) == 1 else str(list(golds))


@dataclass(frozen=True)
class JudgePrompt:
    """A judge prompt: template, output parser and version (implements agent.judge.JudgePromptLike)."""

    name: str
    version: str
    system: str | None
    """System message (None: the prompt is a single user message)."""
    template: str
    parse: Parser
    """Judge output -> True/False, or None when unreadable."""
    max_prediction_chars: int | None = None
    """Cut the prediction to this many characters before rendering (None: keep it whole)."""
    format_golds: Callable[[Sequence[str]], str] = field(default=join_golds)
    empty_prediction: str = ""
    """What stands in for an empty prediction."""

    def render(self, question: str, golds: list[str], prediction: str) -> list[dict[str, str]]:
        """The chat messages of one judgement."""
        pred = prediction if self.max_prediction_chars is None else prediction[: self.max_prediction_chars]
        gold = self.format_golds(list(golds))
        # every placeholder spelling of the published templates: str.format ignores the unused ones
        user = self.template.format(question=question, correct_answer=gold, gt_answer=gold, gold=gold,
                                    response=pred or self.empty_prediction, pred_answer=pred or self.empty_prediction,
                                    prediction=pred or self.empty_prediction)
        head = [{"role": "system", "content": self.system}] if self.system else []
        return [*head, {"role": "user", "content": user}]

    def describe(self) -> dict[str, Any]:
        """Name, version and text (what a run records)."""
        return {"name": self.name, "version": self.version, "system": self.system, "template": self.template,
                "max_prediction_chars": self.max_prediction_chars}


def prompt_version(name: str, system: str | None, template: str, parse: Parser, max_prediction_chars: int | None,
                   format_golds: Callable[..., str], rev: str = "1") -> str:
    """`name-<10 hex>`: a hash of the text, the truncation, the parser and gold rendering (by name) and `rev`
    (bump `rev` when a parser's behaviour changes under the same name)."""
    blob = json.dumps([system, template, max_prediction_chars, parse.__qualname__, format_golds.__qualname__, rev],
                      ensure_ascii=False)
    return f"{name}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}"


def make_prompt(name: str, system: str | None, template: str, parse: Parser, *, max_prediction_chars: int | None = None,
                format_golds: Callable[[Sequence[str]], str] = join_golds, empty_prediction: str = "",
                rev: str = "1") -> JudgePrompt:
    """A JudgePrompt whose version is computed from its content (`prompt_version`)."""
    version = prompt_version(name, system, template, parse, max_prediction_chars, format_golds, rev)
    return JudgePrompt(name, version, system, template, parse, max_prediction_chars, format_golds, empty_prediction)


# ---- xBench-DeepSearch ----------------------------------------------------------------------------------

XBENCH_TEMPLATE = """
你是一个通用人工智能助手。根据下面给出的[正确答案], 判断以下对[原问题]的[回答]的回答是否正确。

[原问题]: {question}

[正确答案]: {correct_answer}

[回答]:{response}

你的判断必须按照以下格式和标准进行:

最终答案: 从[回答]中提取出的最终准确答案。如果[回答]中没有明确的最终答案, 则填写'无'。

解释: 根据[正确]解释为什么[最终答案]是正确的或错误的。只关注[最终答案]与[正确答案]之间是否存在实质性差异, 不要评论题目的背景, 不要尝试重新解题, 不要为任何不同于[正确答案]的答案辩护, 只专注于判断答案是否一致。

结论: 如果[最终答案]与上方给出的[正确答案]一致, 或者在数值题目中处于可接受的微小误差范围内, 则填写'正确'; 否则（即存在任何不一致、歧义、不等价或提取出的答案错误的情况）填写'错误'。
""".strip()

_XBENCH_CONCLUSION = re.compile(r"^[\s*#>\-]*结论[\s*]*[:：]?[\s*]*(.*)$")
_QUOTES_AND_MARKS = "*'\"“”‘’「」『』【】[]()（）`_ \t"


_XBENCH_VALUE = re.compile(r"(不正确|正确|错误)(.*)", re.DOTALL)
_XBENCH_ALTERNATIVE = re.compile(r"\s*[/、|或]\s*(不正确|正确|错误)")


def parse_xbench(text: str) -> bool | None:
    """The last `结论` line (or, when it is a bare heading, the next non-empty line): a value beginning with
    正确 -> True, with 错误 or 不正确 -> False; anything else, or an echoed "正确/错误", -> None."""
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        m = _XBENCH_CONCLUSION.match(lines[i])
        if not m:
            continue
        value = m.group(1).strip(_QUOTES_AND_MARKS)
        if not value:  # "**结论**:" with the verdict on the next line
            value = next((ln for ln in lines[i + 1:] if ln.strip()), "").strip(_QUOTES_AND_MARKS)
        v = _XBENCH_VALUE.match(value)
        if v is None or _XBENCH_ALTERNATIVE.match(v.group(2)):
            return None
        return v.group(1) == "正确"
    return None


def xbench_direct_match(response: str, correct_answer: str) -> bool:
    """xBench's judge bypass, as in `grade_question`: the first `最终答案:` of the response, its text after
    the first ASCII ':' up to the end of the line, stripped, equals the gold exactly (then no judge call)."""
    m = re.search(r"最终答案:*(.*)", response)
    if m is None:
        return False
    parts = m.group(0).split(":")
    extracted = parts[1].strip() if len(parts) > 1 else m.group(0)  # official: the whole match when no ':'
    return extracted == correct_answer


# ---- BrowseComp (HLE grader) ----------------------------------------------------------------------------

BROWSECOMP_TEMPLATE = """
Judge whether the following [response] to [question] is correct or not based on the precise and unambiguous [correct_answer] below.

[question]: {question}

[response]: {response}

Your judgement must be in the format and criteria specified below:

extracted_final_answer: The final exact answer extracted from the [response]. Put the extracted answer as 'None' if there is no exact, final answer to extract from the response.

[correct_answer]: {correct_answer}

reasoning: Explain why the extracted_final_answer is correct or incorrect based on [correct_answer], focusing only on if there are meaningful differences between [correct_answer] and the extracted_final_answer. Do not comment on any background to the problem, do not attempt to solve the problem, do not argue for any answer different than [correct_answer], focus only on whether the answers match.

correct: Answer 'yes' if extracted_final_answer matches the [correct_answer] given above, or is within a small margin of error for numerical problems. Answer 'no' otherwise, i.e. if there if there is any inconsistency, ambiguity, non-equivalency, or if the extracted answer is incorrect.


confidence: The extracted confidence score between 0|\\%| and 100|\\%| from [response]. Put 100 if there is no confidence score available.
""".strip()

# the official `re.search(r"correct: (yes|no)", ...)`, anchored to a line so that prose such as
# "is not correct: no match" in the reasoning does not count, and tolerant of case and markdown
_BROWSECOMP_CORRECT = re.compile(r"^[\s*#>\-]*correct[\s*]*:[\s*]*(yes|no)\b", re.IGNORECASE | re.MULTILINE)
_BROWSECOMP_CONFIDENCE = re.compile(r"^[\s*#>\-]*confidence[\s*]*:[\s*]*(\d+(?:\.\d+)?)", re.IGNORECASE | re.MULTILINE)


def parse_browsecomp(text: str) -> bool | None:
    """`correct: yes` -> True, `correct: no` -> False; none, or lines that disagree -> None."""
    found = {m.lower() for m in _BROWSECOMP_CORRECT.findall(text)}
    return None if len(found) != 1 else found == {"yes"}


def browsecomp_confidence(text: str) -> float | None:
    """The grader's `confidence:` in percent (None when absent), for calibration error."""
    m = _BROWSECOMP_CONFIDENCE.search(text)
    return float(m.group(1)) if m else None


# ---- GAIA (WebAgent / Tongyi / MiroThinker) ---------------------------------------------------------------

GAIA_TEMPLATE = """You are an evaluation assistant. Please determine if the predicted answer is equivalent to the labeled answer.

Question: {question}

Labeled Answer: {correct_answer}

Predicted Answer: {response}

Did the model give an answer **equivalent** to the labeled answer? Please respond with "Correct" if they are equivalent, or "Incorrect" if they are not equivalent. Do not include any other text.
"""


def _bare_word(text: str) -> str:
    return text.strip().strip(_QUOTES_AND_MARKS + ".").strip().lower()


def parse_correct_incorrect(text: str) -> bool | None:
    """The reply, else its last non-empty line, is exactly Correct/Incorrect (markdown, quotes, a period and
    case tolerated) -> True/False; anything else -> None."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for candidate in (text, lines[-1] if lines else ""):
        word = _bare_word(candidate)
        if word in ("correct", "incorrect"):
            return word == "correct"
    return None


# ---- ASearcher DefaultJudge -------------------------------------------------------------------------------

ASEARCHER_TEMPLATE = """You are an evaluation assistant. Please determine if the predicted answer is equivalent to the labeled answer.

Question: {question}

Labeled Answer: {gt_answer}

Predicted Answer: {pred_answer}

Did the model give an answer **equivalent** to the labeled answer? Please respond with "Correct" if they are equivalent, or "Incorrect" if they are not equivalent.

The output should in the following json format:
```json
{{
    "rationale": your rationale for the judgement, as a text,
    "judgement": your judgement result, can only be "Correct" or "Incorrect",
}}
```
"""


def parse_asearcher(text: str) -> bool | None:
    """ASearcher's `cal_metrics` (see the module docstring); None where it says "Invalid"."""
    block = text.split("```json")[-1].split("```")[0].strip()
    obj: Any = None
    for load in (json.loads, ast.literal_eval):
        try:
            obj = load(block)
            break
        except Exception:  # any failure (syntax, recursion depth) just means "not this parser"
            continue
    if isinstance(obj, dict):
        value = obj.get("judgement")
        word = value.strip().strip(".").lower() if isinstance(value, str) else ""
        return {"correct": True, "incorrect": False}.get(word)
    lower = text.lower()
    if '"judgement": "incorrect"' in lower:
        return False
    if '"judgement": "correct"' in lower or '"judgement": correct' in lower:
        return True
    return None


# ---- registry ----------------------------------------------------------------------------------------------

for _prompt in (
    make_prompt("xbench", None, XBENCH_TEMPLATE, parse_xbench),
    make_prompt("browsecomp", None, BROWSECOMP_TEMPLATE, parse_browsecomp),
    make_prompt("gaia", None, GAIA_TEMPLATE, parse_correct_incorrect),
    make_prompt("asearcher", None, ASEARCHER_TEMPLATE, parse_asearcher, max_prediction_chars=500,
                format_golds=python_list_golds),
    # exactly LLMJudge's built-in prompt and version, so both share cached verdicts; the built-in text is
    # pinned by a hash in tests/test_eval_scoring.py so that an edit without a version bump fails
    JudgePrompt("default", JUDGE_PROMPT_VERSION, JUDGE_SYSTEM, JUDGE_PROMPT, parse_verdict,
                max_prediction_chars=500, format_golds=lambda g: join_golds(g) or "(none)",
                empty_prediction="(no answer)"),
):
    JUDGE_PROMPTS.add(_prompt.name, _prompt)


def get_judge_prompt(name: str) -> Any:
    """The judge prompt a name or `pkg.mod:attr` names; ComponentError (a ValueError) naming the valid ones."""
    prompt = JUDGE_PROMPTS.resolve(name)
    if not all(hasattr(prompt, a) for a in ("name", "version", "render", "parse")):
        raise ComponentError(f"eval.judge: '{name}' is a {type(prompt).__name__}, not a judge prompt "
                             "(name, version, render, parse: agent.judge.JudgePromptLike)")
    return prompt
