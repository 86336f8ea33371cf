"""Every prompt of the QA-synthesis agent, in one place, with the parser of its reply.

Replies are labelled lines (`Question: ...`), not JSON: small models keep to lines far more often,
and a line format degrades gracefully (a missing label is a parse failure that the item records,
never a crash). Each prompt carries one short worked example, which is what lets a small model
follow it. A parser returns None when the reply cannot be read; the caller records that as the
action's or check's failure with the raw reply.

| prompt     | role      | used by                                     | reply                           |
|------------|-----------|---------------------------------------------|---------------------------------|
| EXTRACT    | generator | actions.extract: facts of a page            | `- fact` lines                  |
| BASE_QA    | generator | actions.base_question                       | Question / Answer / Fact        |
| FUZZ       | generator | actions.fuzz: obscure a revealing detail    | Question / Obscured             |
| LINK       | generator | actions.inject: describe an entity via a linked page | Description / Fact     |
| COMBINE    | generator | actions.inject: put the description in      | Question                        |
| COVERAGE   | generator | checks.coverage: is the new fact known?     | COVERED: YES / NO               |
| VALIDITY   | generator | checks.validity                             | VALID: YES / NO                 |
| SOLVE      | solver    | checks.difficulty: tool-free attempt        | Answer                          |
| ALTERNATIVE| generator | checks.uniqueness: does another answer fit? | FITS: YES / NO                  |

The judge of solver attempts is agent.judge's (its prompt, cache and parser).
"""

from __future__ import annotations

import re

SYSTEM = "You write and check quiz questions. Follow the output format exactly."
PROMPT_VERSION = "v1"

EXTRACT = """\
List the facts that this encyclopedia page states. Write one fact per line, starting with "- ". Each fact \
is one short sentence that names its subject (no "it" or "he").

Example page:
Lake Varo
Lake Varo is a lake in Tesmia. It covers 40 square kilometres and was named in 1820.
Example facts:
- Lake Varo is a lake in Tesmia.
- Lake Varo covers 40 square kilometres.
- Lake Varo was named in 1820.

Page:
{title}
{text}
Facts:"""

BASE_QA = """\
Write one question about {title} that is answered by exactly one of the facts below. The answer is a \
name, a year or a number from that fact, and the question must not contain the answer.

Example facts:
1. Lake Varo is a lake in Tesmia.
2. Lake Varo was named in 1820.
Example reply:
Question: In which year was Lake Varo named?
Answer: 1820
Fact: 2

Facts:
{facts}
Reply with three lines: Question, Answer, Fact."""

FUZZ = """\
Make the question harder without changing its answer: replace one detail that points too directly at \
the answer with a vaguer description (a name becomes a description, a year becomes a decade, a number \
becomes a range). Do not mention the answer.

Example:
Question: In which year was Lake Varo in Tesmia named?
Answer: 1820
Reply:
Question: In which year was a 40-square-kilometre lake in Tesmia named?
Obscured: Lake Varo

Question: {question}
Answer: {answer}
Known facts:
{facts}
Reply with two lines: Question, Obscured."""

LINK = """\
Describe {entity} without naming it, using one fact from the page of {other} below, so that a reader \
must look up {other} to know which entity is meant.

Example: entity Tesmia, facts of the page of Lake Varo: 1. Lake Varo is a lake in Tesmia.
Reply:
Description: the country where Lake Varo lies
Fact: 1

Facts of the page of {other}:
{facts}
Reply with two lines: Description, Fact."""

COMBINE = """\
Rewrite the question, replacing "{entity}" with the description "{description}". Change nothing else \
except what grammar needs.

Example: question "What is the capital of Tesmia?", entity Tesmia, description "the country where Lake \
Varo lies".
Reply:
Question: What is the capital of the country where Lake Varo lies?

Question: {question}
Reply with one line: Question."""

COVERAGE = """\
Known facts:
{facts}
New fact: {fact}
Is the new fact already stated by the known facts, or does it follow from them?
Reply with one line: COVERED: YES or COVERED: NO"""

VALIDITY = """\
Check this quiz question.
Question: {question}
Answer: {answer}
Supporting facts:
{facts}
It is valid only if (1) it asks for one thing, not several questions joined together, (2) the \
supporting facts are enough to find the answer, and (3) the answer is the only one that fits.
Reply with one line: VALID: YES or VALID: NO, then a short reason."""

SOLVE = """\
Answer the question from what you know, with a short answer only (a name, a year or a number). If you \
are not sure, give your best guess.
Question: {question}
Reply with one line: Answer: ..."""

ALTERNATIVE = """\
Question: {question}
Correct answer: {answer}
Supporting facts:
{facts}
Candidate answer: {candidate}
Does the candidate answer also satisfy every condition in the question (given the facts)?
Reply with one line: FITS: YES or FITS: NO"""


def messages(template: str, **fields: object) -> list[dict[str, str]]:
    """System + user messages of one prompt."""
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": template.format(**fields)}]


def numbered(facts: list[str]) -> str:
    """Facts as a numbered list (the numbering the `Fact:` lines refer to)."""
    return "\n".join(f"{i}. {f}" for i, f in enumerate(facts, 1))


_BULLET = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+(.*\S)\s*$")


def parse_facts(text: str, limit: int) -> list[str] | None:
    """`- fact` (or `1. fact`) lines -> facts (deduplicated, in order, at most `limit`); None when there are none."""
    out: list[str] = []
    for line in text.splitlines():
        m = _BULLET.match(line)
        if m and len(m.group(1).split()) >= 3 and m.group(1) not in out:
            out.append(m.group(1))
    return out[:limit] or None


def labelled(text: str, *labels: str) -> dict[str, str] | None:
    """The first value of each `Label: value` line (labels matched case-insensitively, Markdown bold
    tolerated); None when any label is missing or empty."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        m = re.match(r"^\s*\**\s*([A-Za-z]+)\s*\**\s*:\s*\**\s*(.*?)\s*\**\s*$", line)
        if m:
            key = m.group(1).lower()
            if key in (lb.lower() for lb in labels) and key not in found and m.group(2):
                found[key] = m.group(2)
    return found if all(lb.lower() in found for lb in labels) else None


def fact_number(value: str, count: int) -> int | None:
    """A `Fact: n` value as a 0-based index into `count` facts, or None."""
    m = re.search(r"\d+", value)
    if m is None:
        return None
    i = int(m.group()) - 1
    return i if 0 <= i < count else None


def yes_no(text: str, label: str) -> bool | None:
    """`LABEL: YES` -> True, `LABEL: NO` -> False, else None (the last such line wins; never guessed)."""
    for line in reversed(text.splitlines()):
        m = re.search(rf"{label}\W*(yes|no)\b", line, re.IGNORECASE)
        if m:
            return m.group(1).lower() == "yes"
    return None
