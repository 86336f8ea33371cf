"""Evaluation scoring against hand-worked cases: the GAIA quasi-exact match, SQuAD and ASearcher scorers,
the published judge prompts and their parsers (also through LLMJudge on a ScriptedEngine), and the
Pass@k / Avg@k / majority-vote / bootstrap statistics."""

from __future__ import annotations

import hashlib
import itertools
import random
import warnings

import pytest

from agent.config import JudgeConfig
from agent.judge import JUDGE_PROMPT, JUDGE_SYSTEM, LLMJudge, VerdictCache, build_judge, describe_judge
from eval.judges import (
    BROWSECOMP_TEMPLATE,
    JUDGE_PROMPTS,
    XBENCH_TEMPLATE,
    browsecomp_confidence,
    get_judge_prompt,
    make_prompt,
    parse_asearcher,
    parse_browsecomp,
    parse_correct_incorrect,
    parse_xbench,
    xbench_direct_match,
)
from eval.scorers import SCORERS, gaia, get_scorer, score_all
from eval.stats import avg_at_k, bootstrap_diff, majority_vote, max_at_k, mean_pass_at_k, pass_at_k
from serving.engines.scripted import ScriptedEngine

pytestmark = pytest.mark.timeout(120)
Q, GOLD = "When was Varnholt founded?", ["1642"]


def g(pred, gold):
    """GAIA score of one prediction against one gold, failing on any warning not asked for."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return gaia(pred, [gold])


# ---- GAIA quasi-exact match -----------------------------------------------------------------------------


def test_gaia_numbers_exact_float_after_stripping_dollar_percent_comma():
    assert g("$1,000", "1000") == g("1,000", "1000") == g("1000.0", "1000") == g(" 1000 ", "1000") == 1.0
    assert g("15%", "15") == 1.0 and g("15%", "0.15") == 0.0  # % is removed, not interpreted
    assert g("1.0", "1") == g("1", "1.0") == g("1e3", "1000") == g("3.140", "3.14") == 1.0
    assert g("3.14159", "3.14") == 0.0  # exact equality, no tolerance
    for wrong in ("1 000", "1000 dollars", "one thousand", "€1000", "1000 km", "", "1/1000"):
        assert g(wrong, "1000") == 0.0, wrong
    assert g("17", " 17 ") == 1.0  # the gold parses as a float with spaces around it
    assert g("garbage", "inf") == 0.0  # unparseable is wrong (officially inf, which would equal "inf")


def test_gaia_lists_in_order_elementwise_punctuation_kept():
    gold = "apple, banana; cherry"
    assert g("Apple,banana;cherry", gold) == g("apple ,  BANANA , cherry", gold) == 1.0
    assert g("apple, cherry, banana", gold) == 0.0  # order matters
    with pytest.warns(UserWarning, match="Answer lists have different lengths"):
        assert gaia("apple, banana", [gold]) == 0.0
    # string elements: lowercase and no whitespace, but punctuation KEPT
    assert g("St Louis, Boston", "St. Louis, Boston") == 0.0
    assert g("st.louis,boston", "St. Louis, Boston") == 1.0
    assert g("St Louis", "St. Louis") == 1.0  # the plain string rule removes punctuation
    assert g("A, 10km", "a, 10 km") == 1.0
    # numeric elements compare as numbers
    assert g("1.0, $2.5, 3%", "1, 2.5, 3") == g("1,2.50,3", "1, 2.5, 3") == 1.0
    assert g("1, two, 3", "1, 2.5, 3") == 0.0
    # a gold "1,000" is a two-element list on the leaderboard: only the same split matches
    assert g("1,000", "1,000") == 1.0
    with pytest.warns(UserWarning):
        assert gaia("1000", ["1,000"]) == 0.0


def test_gaia_strings_whitespace_punctuation_case_no_article_removal():
    assert g("Seagull", "sea gull") == g("the beatles!", "The Beatles") == g("usa", "U.S.A.") == 1.0
    assert g("Beatles", "The Beatles") == 0.0  # no article removal
    assert g("cafe", "café") == 0.0  # only ASCII punctuation and whitespace are normalised
    assert gaia(None, ["x"]) == 0.0 and gaia("x", []) == 0.0
    assert gaia("paris", ["1000", "Paris"]) == 1.0  # max over aliases


# ---- SQuAD / ASearcher scorers ---------------------------------------------------------------------------


def test_squad_scorers():
    em, f1, sub = SCORERS.resolve("em"), SCORERS.resolve("f1"), SCORERS.resolve("sub_em")
    assert em("The  Eiffel Tower!", ["eiffel tower"]) == 1.0 and em("Eiffel", ["eiffel tower"]) == 0.0
    assert f1("Eiffel Tower in Paris", ["the Eiffel Tower"]) == pytest.approx(2 / 3)  # P 2/4, R 2/2
    assert f1("a a b", ["a b b"]) == pytest.approx(2 / 3)  # multiset overlap: one a, one b
    assert sub("founded in 1642.", ["1642"]) == 1.0 and sub("party", ["art"]) == 0.0
    assert sub("tower eiffel", ["eiffel tower"]) == 0.0  # contiguous, in order
    for name in ("em", "f1", "sub_em", "cover_em", "set_f1", "asearcher_f1", "gaia"):
        assert SCORERS.resolve(name)(None, ["x"]) == 0.0


def test_cover_em_is_asearchers_token_cover():
    cem = SCORERS.resolve("cover_em")
    assert cem("France, Paris", ["Paris France"]) == 1.0  # any order, not adjacent
    assert cem("It is in Paris, the capital", ["Paris capital"]) == 1.0
    assert cem("Paris", ["Paris France"]) == 0.0
    assert cem("parisian", ["paris"]) == 0.0  # whole tokens, not substrings
    assert cem("yes", ["True"]) == cem("True", ["yes"]) == 1.0  # bool_mapping of the exact strings
    assert cem("true", ["yes"]) == 0.0
    assert cem("anything", ["the"]) == 0.0 and cem("a", ["the"]) == 1.0  # "".split(" ") == [""]
    assert cem("Lyon", ["Paris", "Lyon"]) == 1.0


def test_set_f1_and_asearcher_eval_f1():
    assert SCORERS.resolve("set_f1")("a b c c", ["b c d"]) == pytest.approx(2 / 3)  # sets: {a,b,c} vs {b,c,d}
    assert SCORERS.resolve("set_f1")("北京", ["北京市"]) == pytest.approx(0.8)  # CJK chars are tokens
    assert SCORERS.resolve("asearcher_f1")("北京", ["北京市"]) == 0.0  # evaluate.py keeps the run whole
    assert SCORERS.resolve("asearcher_f1")("The U.S.-Canada border", ["us canada"]) == pytest.approx(2 / 7)  # P 1/5, R 1/2
    assert SCORERS.resolve("asearcher_f1")("", [""]) == 0.0 and SCORERS.resolve("set_f1")("", [""]) == 1.0


def test_score_all_and_registry():
    out = score_all("$1,000", ["1000"], ["gaia", "em", "f1"])
    assert out == {"gaia": 1.0, "em": 1.0, "f1": 1.0}  # SQuAD drops "$" and "," too
    assert score_all(None, ["x"], ["em", "cover_em"]) == {"em": 0.0, "cover_em": 0.0}
    with pytest.raises(ValueError, match=r"unknown scorer 'bleu'. Valid: gaia, em"):
        score_all("x", ["x"], ["em", "bleu"])
    assert get_scorer("f1") is SCORERS.resolve("f1")


# ---- judge prompts and parsers ----------------------------------------------------------------------------


def test_xbench_parser():
    ok = "最终答案: 1642\n\n解释: [最终答案]与[正确答案]一致。\n\n结论: 正确"
    assert parse_xbench(ok) is True
    assert parse_xbench("最终答案: 1643\n解释: 不一致。\n结论：错误") is False
    assert parse_xbench("**结论**: 不正确") is False  # the official regex would read 正确 here
    assert parse_xbench("结论: '正确'。") is True and parse_xbench("## 结论:\n\n**错误**") is False
    for bad in ("我认为答案是对的", "结论: 正确/错误", "结论: 无法判断", "", "最终答案: 1642\n解释: 一致",
                XBENCH_TEMPLATE):  # a judge that echoes the template says nothing
        assert parse_xbench(bad) is None, bad


def test_xbench_direct_match_is_the_official_bypass():
    assert xbench_direct_match("思路……\n最终答案: 1642", "1642")
    assert not xbench_direct_match("最终答案: 1642年", "1642")
    assert not xbench_direct_match("最终答案：1642", "1642")  # full-width colon: no bypass, the judge decides
    assert not xbench_direct_match("1642", "1642")


def test_browsecomp_parser():
    ok = ("extracted_final_answer: 1642\n\nreasoning: The response gives 1642, matching [correct_answer].\n\n"
          "correct: yes\n\nconfidence: 85")
    assert parse_browsecomp(ok) is True and browsecomp_confidence(ok) == 85.0
    assert parse_browsecomp("extracted_final_answer: None\nreasoning: no answer\ncorrect: no\nconfidence: 100") is False
    assert parse_browsecomp("**correct:** No") is False and parse_browsecomp("Correct: YES") is True
    for bad in ("The answer is correct.", "correct: yes\ncorrect: no", "correct: maybe", "reasoning: is not correct: no",
                BROWSECOMP_TEMPLATE, ""):
        assert parse_browsecomp(bad) is None, bad
    assert browsecomp_confidence("correct: yes") is None


def test_gaia_and_asearcher_and_default_parsers():
    assert parse_correct_incorrect("Correct") is True and parse_correct_incorrect(" incorrect\n") is False
    assert parse_correct_incorrect("**Incorrect**.") is False
    assert parse_correct_incorrect("Both name the same year.\nCorrect") is True
    for bad in ("correct-ish", "", "Correct or Incorrect", "It is correct"):
        assert parse_correct_incorrect(bad) is None, bad
    assert parse_asearcher('```json\n{"rationale": "same year", "judgement": "Correct"}\n```') is True
    assert parse_asearcher("```json\n{'rationale': 'differs', 'judgement': 'Incorrect',}\n```") is False  # literal
    assert parse_asearcher('{"rationale": "x" "judgement": "incorrect"}') is False  # broken JSON: substring rule
    assert parse_asearcher('{"rationale": broken, "judgement": "Correct"}') is True
    for bad in ('{"rationale": "x", "judgement": "maybe"}', '{"rationale": "x"}', "no json here", "```json\n```"):
        assert parse_asearcher(bad) is None, bad
    assert JUDGE_PROMPTS.resolve("default").parse("x\nVERDICT: INCORRECT") is False
    assert JUDGE_PROMPTS.resolve("default").parse("no verdict") is None


def test_prompt_rendering_and_versions():
    (msg,) = JUDGE_PROMPTS.resolve("xbench").render(Q, GOLD, "in 1642")
    assert msg["role"] == "user" and "[正确答案]: 1642" in msg["content"] and "[回答]:in 1642" in msg["content"]
    assert msg["content"].startswith("你是一个通用人工智能助手。") and msg["content"].endswith("填写'错误'。")
    (msg,) = JUDGE_PROMPTS.resolve("browsecomp").render(Q, GOLD, "Exact Answer: 1642")
    assert "[correct_answer]: 1642" in msg["content"] and "0|\\%| and 100|\\%|" in msg["content"]
    (msg,) = JUDGE_PROMPTS.resolve("gaia").render(Q, ["a", "b"], "a")
    assert "Labeled Answer: a | b" in msg["content"] and msg["content"].rstrip().endswith("Do not include any other text.")
    (msg,) = JUDGE_PROMPTS.resolve("asearcher").render(Q, ["a", "b"], "x" * 600)
    assert "Labeled Answer: ['a', 'b']" in msg["content"] and "x" * 500 + "\n" in msg["content"]
    assert "x" * 501 not in msg["content"] and '"judgement": your judgement result' in msg["content"]
    # the default is LLMJudge's built-in prompt, message for message, with its version
    judge = LLMJudge(ScriptedEngine([]), "j")
    for pred in ("in 1642", "", "y" * 700):
        assert JUDGE_PROMPTS.resolve("default").render(Q, GOLD, pred) == judge.messages(Q, GOLD, pred)
    assert JUDGE_PROMPTS.resolve("default").version == judge.prompt_version == "v1"
    # the built-in text is pinned: editing it must come with a new JUDGE_PROMPT_VERSION (and this hash)
    assert hashlib.sha256((JUDGE_SYSTEM + "\n" + JUDGE_PROMPT).encode()).hexdigest()[:16] == "c3182b612d3fcdba"
    versions = [JUDGE_PROMPTS.resolve(name).version for name in JUDGE_PROMPTS.names()]
    assert len(set(versions)) == len(versions) and JUDGE_PROMPTS.resolve("xbench").version.startswith("xbench-")
    same = make_prompt("xbench", None, XBENCH_TEMPLATE, parse_xbench)
    edited = make_prompt("xbench", None, XBENCH_TEMPLATE + " ", parse_xbench)
    assert same.version == JUDGE_PROMPTS.resolve("xbench").version != edited.version
    assert make_prompt("xbench", None, XBENCH_TEMPLATE, parse_xbench, rev="2").version != same.version
    with pytest.raises(ValueError, match="unknown judge prompt 'hle'"):
        get_judge_prompt("hle")


# ---- LLMJudge with the published prompts ------------------------------------------------------------------


async def test_llm_judge_with_browsecomp_and_xbench_prompts(tmp_path, tokenizer):
    bc = ScriptedEngine(["extracted_final_answer: 1642\nreasoning: same\ncorrect: yes\nconfidence: 100"],
                        tokenizer=tokenizer)
    judge = LLMJudge(bc, "judge-m", cache=tmp_path / "j.sqlite", prompt=JUDGE_PROMPTS.resolve("browsecomp"))
    v = await judge.judge(Q, GOLD, "Exact Answer: 1642")
    assert v.correct is True and not v.cached and bc.num_calls == 1
    sent = tokenizer.decode(bc.calls[0].prompt_ids)
    assert "[correct_answer]: 1642" in sent and "VERDICT" not in sent
    again = await judge.judge(Q, GOLD, "Exact Answer: 1642")
    assert again.correct is True and again.cached and bc.num_calls == 1
    d = judge.describe()
    assert d["prompt_name"] == "browsecomp" and d["prompt_version"] == JUDGE_PROMPTS.resolve("browsecomp").version
    assert d["prompt_template"] == BROWSECOMP_TEMPLATE and d["system"] is None and d["max_prediction_chars"] is None
    # the same judgement under another prompt version is a cache miss on the same file
    xb = ScriptedEngine(["最终答案: 1642\n解释: 一致\n结论: 正确"], tokenizer=tokenizer)
    cfg = JudgeConfig(model="judge-m", cache=str(tmp_path / "j.sqlite"))
    xjudge = build_judge(cfg, engine=xb, prompt=JUDGE_PROMPTS.resolve("xbench"))
    v = await xjudge.judge(Q, GOLD, "Exact Answer: 1642")
    assert v.correct is True and not v.cached and xb.num_calls == 1
    assert "[原问题]: When was Varnholt founded?" in tokenizer.decode(xb.calls[0].prompt_ids)
    assert (await xjudge.judge(Q, GOLD, "Exact Answer: 1642")).cached and xb.num_calls == 1
    key = VerdictCache.key("judge-m", Q, GOLD, "Exact Answer: 1642", JUDGE_PROMPTS.resolve("xbench").version)
    assert key != VerdictCache.key("judge-m", Q, GOLD, "Exact Answer: 1642", JUDGE_PROMPTS.resolve("browsecomp").version)
    assert xjudge.cache.get(key).correct is True
    described = describe_judge(cfg, JUDGE_PROMPTS.resolve("xbench"))
    assert described["prompt_name"] == "xbench" and described["prompt_template"] == XBENCH_TEMPLATE
    assert {k: v for k, v in xjudge.describe().items() if k.startswith("prompt")} == \
        {k: v for k, v in described.items() if k.startswith("prompt")}
    assert describe_judge(cfg)["prompt_name"] == "default"
    await judge.aclose()
    await xjudge.aclose()


async def test_llm_judge_malformed_published_format_is_retried_then_none(tmp_path, tokenizer):
    engine = ScriptedEngine(["我不确定", "结论: 正确/错误", "最终答案: 1642"], tokenizer=tokenizer)
    judge = LLMJudge(engine, "j", cache=tmp_path / "j.sqlite", retries=2, prompt=JUDGE_PROMPTS.resolve("xbench"))
    v = await judge.judge(Q, GOLD, "1642?")
    assert v.correct is None and v.attempts == 3 and engine.num_calls == 3 and not v.cached
    assert judge.cache.get(VerdictCache.key("j", Q, GOLD, "1642?", judge.prompt_version)) is None
    assert judge.stats()["judge/unparsed"] == 1
    await judge.aclose()


# ---- statistics ----------------------------------------------------------------------------------------------


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_enumeration():
    for n in range(1, 8):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12), (n, c, k)
    assert pass_at_k(1000, 1, 1) == pytest.approx(0.001) and pass_at_k(10_000, 5_000, 100) == pytest.approx(1.0)
    for bad in ((4, 1, 5), (4, 1, 0), (4, 5, 1), (4, -1, 1)):
        with pytest.raises(ValueError):
            pass_at_k(*bad)
    assert mean_pass_at_k([[True, False], [False, False]], 1) == pytest.approx(0.25)
    assert mean_pass_at_k([[True, False], [False, False]], 2) == pytest.approx(0.5)


def test_avg_and_max_at_k():
    assert avg_at_k([[1, 0, 1, 0], [0.5, 0.5]]) == pytest.approx(0.5)
    assert avg_at_k([[1.0], [0.0], [1.0]]) == pytest.approx(2 / 3)
    assert max_at_k([[0, 1, 0], [0.2, 0.4, 0.9]], 2) == pytest.approx((1 + 0.4) / 2)
    for bad in ([], [[1.0], []]):
        with pytest.raises(ValueError):
            avg_at_k(bad)


def test_majority_vote():
    assert majority_vote(["Paris", "London", "paris.", None]) == "Paris"  # normalised classes, first original
    assert majority_vote(["b", "a", "a", "b"]) == "b"  # tie: earliest first occurrence
    assert majority_vote(["The Eiffel Tower", "Louvre", "eiffel tower"]) == "The Eiffel Tower"
    assert majority_vote(["Paris", "paris", "London", "London"], normalize=None) == "London"  # exact strings
    assert majority_vote([None, None]) is None and majority_vote([]) is None


def test_bootstrap_diff_covers_the_truth_and_is_deterministic():
    rng = random.Random(1)
    a = [float(rng.random() < 0.7) for _ in range(500)]
    b = [float(rng.random() < 0.5) for _ in range(500)]
    diff, lo, hi = bootstrap_diff(a, b, iters=2000, seed=0)
    assert lo < 0.2 < hi and lo < diff < hi and diff == pytest.approx(sum(a) / 500 - sum(b) / 500)
    assert 0.08 < hi - lo < 0.16  # about 2 * 1.96 * sqrt((0.21 + 0.25) / 500) = 0.12
    assert bootstrap_diff(a, b, iters=2000, seed=0) == (diff, lo, hi)
    # another seed resamples differently (continuous scores: 0/1 ones put percentiles on a 1/500 grid)
    f1a, f1b = [rng.random() for _ in range(200)], [rng.random() for _ in range(200)]
    assert bootstrap_diff(f1a, f1b, seed=1) != bootstrap_diff(f1a, f1b, seed=0) == bootstrap_diff(f1a, f1b, seed=0)
    assert bootstrap_diff([1.0, 0.0], [1.0, 0.0]) == (0.0, 0.0, 0.0)
    # coverage of the 95% interval over many synthetic suites with a known difference of 0.2
    hits = 0
    for trial in range(100):
        r = random.Random(100 + trial)
        a = [float(r.random() < 0.7) for _ in range(120)]
        b = [float(r.random() < 0.5) for _ in range(120)]
        _, lo, hi = bootstrap_diff(a, b, iters=400, seed=trial)
        hits += lo <= 0.2 <= hi
    assert 88 <= hits <= 99
    with pytest.raises(ValueError, match="equal lengths"):
        bootstrap_diff([1.0], [1.0, 0.0])
    with pytest.raises(ValueError):
        bootstrap_diff([], [])
