"""OracleEngine: a scripted policy that solves world questions by following their known evidence chains.

It is an `InferenceEngine` (a `ScriptedEngine` whose responder decides each output), so the real agent
loop (agent/loop.py) drives it with the config's prompt, action format, prefill and context policy, and
the trajectory it records is token-exact: its policy tokens are exactly what the policy would have to
produce. For each registered episode (`expect(request_id, item)`) it answers the loop's calls in order:

    act turn   `<search>TITLE</search>` for the next page of the item's `chain` (title = the URL's last
               path part, url-unquoted, `_` -> space), then `<answer>ANSWER</answer>` (the first answer)
    read turn  a one-line note, then `</think>`

and emits only what the harness has not written itself: with `agent.prefill: tags` the loop has already
appended `<search>` (or `<answer>` once the tool budget is spent, which makes the oracle answer at once);
with `prefill: think` it closes the thought first. In the `hermes` format a search is a `<tool_call>` JSON
ending with EOS. Tokens are the tokenizer's ids of that text, with log-prob 0 and version 0.

It also watches what the tools returned: `complete(request_id)` is True only when every chain page was
searched and its title appeared in the results that followed (retrieval can miss), so sources keep only
trajectories that show the evidence they answer from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from serving.engines.scripted import ScriptedEngine, ScriptedOutput
from serving.protocol import GenerateRequest


def chain_titles(chain: list[str]) -> list[str]:
    """Page titles of a chain of page URLs (`https://hexwiki.test/wiki/Zetre_Tadrusdel` -> `Zetre Tadrusdel`)."""
    return [unquote(str(url).rstrip("/").rsplit("/", 1)[-1]).replace("_", " ") for url in chain]


@dataclass
class _Plan:
    """One episode's script and what the oracle has seen of it so far."""

    titles: list[str]
    answer: str
    searched: int = 0
    answered: bool = False
    cursor: int = 0
    """Prompt tokens already seen (the oracle reads only what the harness appended since its last output)."""
    observed: str = ""
    """Harness text since the last search: where that search's page title must appear."""
    missed: list[str] = field(default_factory=list)


class OracleEngine(ScriptedEngine):
    """See the module docstring. `action_format` is `agent.action_format`; `query_key` the search tool's
    argument name in the `hermes` format."""

    def __init__(self, tokenizer: Any, action_format: str = "asearcher", query_key: str = "query"):
        super().__init__(responder=self._respond, tokenizer=tokenizer, record=False,
                         logprob_fn=lambda token, position: 0.0)
        self.action_format, self.query_key = action_format, query_key
        self.plans: dict[str, _Plan] = {}

    def expect(self, request_id: str, item: Any) -> None:
        """Register the episode `request_id` will play: a QA item whose `meta` has `chain` (page URLs)."""
        chain = (getattr(item, "meta", None) or {}).get("chain")
        if not isinstance(chain, list) or not item.answers:
            raise ValueError(f"question {getattr(item, 'id', '?')}: the oracle needs a `chain` of page URLs and an answer")
        self.plans[request_id] = _Plan(chain_titles(chain), item.answers[0])

    def complete(self, request_id: str) -> bool:
        """The episode searched every chain page, saw each one in the results, and answered."""
        plan = self.plans[request_id]
        return plan.answered and plan.searched == len(plan.titles) and not plan.missed

    def forget(self, request_id: str) -> None:
        self.plans.pop(request_id, None)

    # --- the policy -------------------------------------------------------------------------------
    def _respond(self, prompt_ids: list[int], request: GenerateRequest) -> ScriptedOutput:
        plan = self.plans.get(request.request_id)
        if plan is None:
            raise RuntimeError(f"OracleEngine: no question registered for request {request.request_id!r}")
        plan.observed += self.tokenizer.decode(prompt_ids[plan.cursor:], skip_special_tokens=False)
        tail = self.tokenizer.decode(prompt_ids[-24:], skip_special_tokens=False)
        if set(request.sampling.stop) == {"</think>"}:  # a read turn: `<think>\n` is prefilled
            text = f"Read about {plan.titles[plan.searched - 1] if plan.searched else 'the question'}.\n</think>"
            return self._output(text, prompt_ids, plan)
        if plan.searched:  # the results of the previous search are in: did its page come back?
            title = plan.titles[plan.searched - 1]
            if title.casefold() not in plan.observed.casefold():
                plan.missed.append(title)
        plan.observed = ""
        if plan.searched < len(plan.titles) and not tail.endswith("<answer>"):
            action, end = self._search(plan.titles[plan.searched]), self.action_format == "hermes"
            plan.searched += 1
        else:
            action, end = f"<answer>{plan.answer}</answer>", False
            plan.answered = True
        text = action[_prefilled(tail, action):]
        if tail.endswith("<think>\n"):  # `prefill: think`: close the (empty) thought before acting
            text = "</think>\n" + text
        return self._output(text, prompt_ids, plan, eos=end)

    def _search(self, title: str) -> str:
        if self.action_format == "hermes":
            call = json.dumps({"name": "search", "arguments": {self.query_key: title}}, ensure_ascii=False)
            return f"<tool_call>\n{call}\n</tool_call>"
        return f"<search>{title}</search>"

    def _output(self, text: str, prompt_ids: list[int], plan: _Plan, eos: bool = False) -> ScriptedOutput:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if eos and self.tokenizer.eos_token_id is not None:  # a hermes tool-call turn ends the message
            ids.append(self.tokenizer.eos_token_id)
        plan.cursor = len(prompt_ids) + len(ids)
        return ScriptedOutput(ids=ids, logprobs=[0.0] * len(ids))


def _prefilled(tail: str, action: str) -> int:
    """How many leading characters of `action` the harness already wrote at the end of the prompt."""
    for k in range(len(action) - 1, 0, -1):
        if action[0] == "<" and tail.endswith(action[:k]):
            return k
    return 0
