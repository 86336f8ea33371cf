"""Encrypted suites (xBench, BrowseComp) with `eval.write_plaintext=false`: a gold answer is written nowhere.

The test runs `hexsearch eval` in this process (its command function, so the policy and the judge can be a
ScriptedEngine) on an encrypted xBench file built as the loader expects. The policy answers wrongly, so no
prediction contains a gold; the judge, as real judges do, quotes the gold answer in its reasoning. Then every
file under the test's folder (run folder, run log, report, the judge's verdict cache) and everything logged
or printed is searched for each gold answer, after a first run, a resumed run and a second run that is
served from the verdict cache."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from test_eval_loaders import XB_CANARY, write_csv

from eval.crypto import encrypt_xbench

GOLDS = {"1": ("哪座湖边的城市建了第一座钟楼?", "苏黎世湖畔XK7"), "2": ("Which river runs past the mill?", "Rhine-Q93"),
         "3": ("In which year was the bridge opened?", "1820-ZZ")}


def _scripted_engine(tokenizer):
    """Policy turns answer "Wrong guess"; judge turns (the xBench judge prompt) quote the gold and say 错误."""
    from serving.engines.scripted import ScriptedEngine

    def respond(prompt_ids, request):
        prompt = tokenizer.decode(prompt_ids)
        gold = re.search(r"\[正确答案\]: (.*)", prompt)
        if gold is None:
            return "<answer>Wrong guess</answer>"
        return f"最终答案: Wrong guess\n解释: 正确答案是 {gold.group(1).strip()}, 与回答不一致。\n结论: 错误"

    return ScriptedEngine(responder=respond, tokenizer=tokenizer)


def _every_byte_written(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_an_encrypted_suite_writes_no_gold_answer_anywhere(tmp_path, tokenizer, monkeypatch, caplog, capsys):
    import serving.factory
    from hexsearch.commands.eval_cmd import run_eval

    rows = [[qid, encrypt_xbench(q, XB_CANARY), encrypt_xbench(a, XB_CANARY), "步骤1", XB_CANARY]
            for qid, (q, a) in GOLDS.items()]
    data = write_csv(tmp_path / "DeepSearch.csv", ["id", "prompt", "answer", "reference_steps", "canary"], rows)
    engine = _scripted_engine(tokenizer)
    monkeypatch.setattr(serving.factory, "build_engine", lambda cfg: engine)
    monkeypatch.chdir(tmp_path)  # anything written relative to the working folder lands under the test's folder
    caplog.set_level(logging.DEBUG)
    cache = tmp_path / "judge.sqlite"
    common = ["engine.model=tiny-random", "agent.judge.model=tiny-random", f"agent.judge.cache={cache}",
              f"run.root={tmp_path / 'runs'}", "run.log_level=DEBUG", "eval.tool_cache=false"]

    def evaluate(**kwargs):
        args = dict(config=None, overrides=common, suite="xbench", data=str(data), n=2, k="1,2", limit=None,
                    resume=None)
        run_eval(**{**args, **kwargs})

    evaluate(overrides=[*common, "run.name=first"])
    results = (tmp_path / "runs" / "first" / "results.jsonl").read_text()
    assert results.count('"prediction": "Wrong guess"') == 6 and '"correct": false' in results
    judge_calls = sum("[正确答案]" in tokenizer.decode(c.prompt_ids) for c in engine.calls)
    assert judge_calls >= 3  # the judge really ran (and quoted each gold): one call per distinct prediction
    path = tmp_path / "runs" / "first" / "results.jsonl"
    path.write_text(results.rstrip("\n"))  # killed before the last newline: resuming redoes that sample
    evaluate(overrides=common, resume=str(tmp_path / "runs" / "first"), suite=None, data=None, n=None, k=None)
    assert path.read_text().count("\n") == 6 and '"cached": true' in path.read_text().splitlines()[-1]
    evaluate(overrides=[*common, "run.name=second"])  # a fresh run folder: every verdict from the cache
    assert sum("[正确答案]" in tokenizer.decode(c.prompt_ids) for c in engine.calls) == judge_calls

    written = _every_byte_written(tmp_path)
    assert {"judge.sqlite", "runs/first/results.jsonl", "runs/second/report.json"} <= set(written)
    assert "runs/first/log.txt" in written and "runs/second/log.txt" in written
    said = caplog.text + "".join(capsys.readouterr())
    for qid, (question, gold) in GOLDS.items():
        for name, blob in written.items():
            assert gold.encode() not in blob, f"gold answer of {qid} written to {name}"
            assert question.encode() not in blob, f"question {qid} written to {name}"
        assert gold not in said and question not in said, f"gold answer or question of {qid} logged or printed"
