"""Rewards against hand-worked cases, and the LLM judge (parsing, retries, cache) on a scripted engine."""

from __future__ import annotations

import pytest

from agent.judge import LLMJudge, VerdictCache, parse_verdict
from agent.rewards import (
    answer_score,
    episode_reward,
    exact_match,
    f1_score,
    normalize_answer,
    says_invalid,
    set_f1,
    sub_em,
)
from serving.engines.scripted import ScriptedEngine


def test_squad_normalisation_rules():
    assert normalize_answer("The Eiffel Tower!") == "eiffel tower"  # lowercase, punctuation, article
    assert normalize_answer("  a   cat,  an owl ") == "cat owl"  # articles a/an as words; whitespace collapsed
    assert normalize_answer("Theatre") == "theatre"  # 'the' inside a word stays
    assert normalize_answer("U.S.A.") == "usa"  # punctuation removed, not replaced by spaces
    assert normalize_answer("rock-n-roll") == "rocknroll"
    assert normalize_answer("THE\tEnd\n") == "end"
    assert normalize_answer("1,642") == "1642"


def test_exact_match():
    assert exact_match("The Beatles", "beatles") == 1.0
    assert exact_match("Beatles.", "The Beatles") == 1.0
    assert exact_match("Beatles band", "The Beatles") == 0.0


def test_f1_hand_worked():
    # pred tokens [paris, france], gold [paris] -> P = 1/2, R = 1, F1 = 2*(1/2)/(3/2) = 2/3
    assert f1_score("Paris, France", "Paris") == pytest.approx(2 / 3)
    # pred [new, york, city], gold [new, york] -> P = 2/3, R = 1 -> F1 = 0.8
    assert f1_score("New York City", "the New York") == pytest.approx(0.8)
    # multiset: pred [a1 a1] vs gold [a1]: common = 1, P = 1/2, R = 1 -> 2/3 (sets would give 1)
    assert f1_score("bob bob", "bob") == pytest.approx(2 / 3)
    assert f1_score("Lyon", "Paris") == 0.0
    assert f1_score("the", "a") == 1.0  # both normalise to nothing
    assert f1_score("the", "Paris") == 0.0


def test_sub_em_is_word_level_containment():
    assert sub_em("It was founded in 1642.", "1642") == 1.0
    assert sub_em("Dalia Orrent founded it", "dalia orrent") == 1.0
    assert sub_em("a party", "art") == 0.0  # substring of a word does not count
    assert sub_em("Orrent Dalia", "Dalia Orrent") == 0.0  # order matters


def test_set_f1_asearcher_compatible():
    # sets: pred {bob} vs gold {bob}: 1.0 (SQuAD's multiset F1 gives 2/3)
    assert set_f1("bob bob", "bob") == 1.0
    # punctuation becomes spaces (not removed): "U.S." -> {u, s}; articles are kept
    assert set_f1("U.S.", "u s") == 1.0
    assert set_f1("the cat", "cat") == pytest.approx(2 / 3)
    # CJK characters are single tokens; digit runs stay whole: {北, 京, 2008} vs {北, 京}
    assert set_f1("北京2008", "北京") == pytest.approx(0.8)


def test_max_over_aliases_and_aug_weighting():
    assert answer_score("NYC", ["New York City", "NYC"], metric="em") == 1.0
    # only an aug alias matches: (1 - 0.3) * 0 + 0.3 * max(0, 1) = 0.3
    assert answer_score("Big Apple", ["New York City"], ["Big Apple"], metric="em") == pytest.approx(0.3)
    # the main answer matches: 0.7 * 1 + 0.3 * max(1, 0) = 1
    assert answer_score("New York City", ["New York City"], ["Big Apple"], metric="em") == pytest.approx(1.0)
    # partial: f1 gold 2/3, aug 1 -> 0.7 * 2/3 + 0.3 * 1 = 0.7667
    assert answer_score("Paris France", ["Paris"], ["Paris France"]) == pytest.approx(0.7 * 2 / 3 + 0.3)


def test_episode_reward_gate_and_penalty():
    r, info = episode_reward("1642", ["1642"], metric="em")
    assert r == 1.0 and info["em"] == 1.0 and info["format_ok"]
    assert episode_reward(None, ["1642"])[0] == 0.0
    assert episode_reward("1642", ["1642"], format_errors=1)[0] == 0.0
    assert episode_reward("1642", ["1642"], format_errors=1, format_gate=False)[0] == 1.0
    r, info = episode_reward("The question is invalid.", ["1642"], forced_valid=True)
    assert r == -0.5 and info["invalid"]
    assert episode_reward("The question is invalid.", ["1642"], forced_valid=False)[0] == 0.0
    assert episode_reward("x", ["1642"], metric="judge", score=1.0)[0] == 1.0


def test_under_search_penalty_replaces_the_score_of_an_answer_with_too_few_searches():
    # off by default: the score stands, the info still says the answer came too early
    r, info = episode_reward("1642", ["1642"], searches=1, min_searches=2)
    assert r == 1.0 and info["under_searched"]
    # on: a right guess and a wrong one both get the penalty; enough searches keep the score
    assert episode_reward("1642", ["1642"], searches=1, min_searches=2, under_search_penalty=-0.5)[0] == -0.5
    assert episode_reward("1700", ["1642"], searches=1, min_searches=2, under_search_penalty=-0.5)[0] == -0.5
    r, info = episode_reward("1642", ["1642"], searches=2, min_searches=2, under_search_penalty=-0.5)
    assert r == 1.0 and not info["under_searched"]
    # no answer is not a guess; an unknown min_searches (0) never penalises; invalid keeps its own penalty
    assert episode_reward(None, ["1642"], searches=0, min_searches=2, under_search_penalty=-0.5)[0] == 0.0
    assert episode_reward("1700", ["1642"], searches=0, under_search_penalty=-0.5)[0] == 0.0
    assert episode_reward("The question is invalid.", ["1642"], searches=0, min_searches=2,
                          under_search_penalty=-0.2, invalid_penalty=-0.5)[0] == -0.5


def test_says_invalid_uses_whole_words():
    assert says_invalid("the question is invalid")
    assert not says_invalid("Invalides hospital")


def test_parse_verdict_robust_to_junk():
    assert parse_verdict("Same city.\nVERDICT: CORRECT") is True
    assert parse_verdict("verdict - **Incorrect**") is False
    assert parse_verdict('{"rationale": "same", "verdict": "correct"}') is True
    assert parse_verdict("VERDICT: CORRECT\nwait, no.\nVERDICT: INCORRECT") is False  # the last line wins
    assert parse_verdict("VERDICT: CORRECT or VERDICT: INCORRECT") is None  # an echoed instruction
    assert parse_verdict("It is not correct") is None
    assert parse_verdict("") is None


async def test_judge_cache_and_unparseable(tmp_path, tokenizer):
    engine = ScriptedEngine(["They match.\nVERDICT: CORRECT", "???", "still junk", "nope"], tokenizer=tokenizer)
    judge = LLMJudge(engine, "scripted-judge", cache=tmp_path / "judge.sqlite", retries=2)
    v = await judge.judge("When was Varnholt founded?", ["1642"], "in 1642")
    assert v.correct is True and not v.cached and judge.calls == 1
    again = await judge.judge("When was Varnholt founded?", ["1642"], "in 1642")
    assert again.correct is True and again.cached and judge.calls == 1  # served by the cache
    # the prompt carries question, gold and prediction
    prompt = engine.tokenizer.decode(engine.calls[0].prompt_ids)
    assert "Varnholt" in prompt and "1642" in prompt and "VERDICT" in prompt
    bad = await judge.judge("Q", ["a"], "b")
    assert bad.correct is None and bad.attempts == 3 and bad.raw == "nope"  # 1 try + 2 retries, all junk
    assert judge.cache.get(VerdictCache.key("scripted-judge", "Q", ["a"], "b")) is None  # not cached
    # a new judge over the same file sees the cached verdict (persistent)
    judge2 = LLMJudge(ScriptedEngine([], tokenizer=tokenizer), "scripted-judge", cache=tmp_path / "judge.sqlite")
    assert (await judge2.judge("When was Varnholt founded?", ["1642"], "in 1642")).correct is True
    # a different judge model is a different key
    with pytest.raises(RuntimeError, match="script exhausted"):
        await LLMJudge(ScriptedEngine([], tokenizer=tokenizer), "other", cache=tmp_path / "judge.sqlite").judge(
            "When was Varnholt founded?", ["1642"], "in 1642")
