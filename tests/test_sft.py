"""`hexsearch sft`: oracle trajectories through the real agent loop, the SFT loss through the RL learner, the
run folder, export and `train.init_from`, and the refusals (malformed row, other tokenizer, dev questions).

The worlds are the cached small ones (60 entities, 1 hop, short articles; 300 entities, up to 4 hops), with
their real FAISS indexes; the model is the tiny random Llama (the real SmolLM2 tokenizer), and SmolLM2-135M
in the slow test that checks SFT raises the greedy dev reward.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch

from hexsearch.config import load_config

QUICK = ["engine.model=tiny-random", "world.entities=60"]
MULTIHOP = ["engine.model=tiny-random", "world.entities=300", "world.max_hops=4", "world.short_articles=false",
            "agent.prefill=none", "agent.read_search_results=true", "agent.max_turns=30", "agent.max_tool_calls=8",
            "tools.topk=3", "agent.max_new_tokens=64", "agent.max_context_tokens=4096", "engine.max_model_len=4096"]


def _collect(overrides: list[str], n: int):
    from agent.workflow import make_workflow
    from serving.models import load_tokenizer
    from trainer.runtime import load_questions
    from trainer.sft_data import collect
    from world import with_world_index

    cfg = load_config("configs/quickstart.yaml", overrides)
    items = load_questions(cfg)[0][:n]
    cfg, world = with_world_index(cfg)
    workflow = make_workflow(cfg, world_dir=world)

    class Policy:  # collect() takes the policy engine's tokenizer for the oracle
        tokenizer = load_tokenizer(cfg.engine.model)

    kept, counts = asyncio.run(collect(cfg, items, workflow, Policy()))
    asyncio.run(workflow.aclose())
    return items, kept, counts, Policy.tokenizer


def _policy_text(traj, tok) -> str:
    return "".join(tok.decode([t for t, m in zip(s.token_ids, s.loss_mask, strict=True) if m]) for s in traj.segments)


def test_oracle_is_token_exact_under_prefilled_tags_and_earns_reward_1():
    from serving.engines.oracle import chain_titles

    items, kept, counts, tok = _collect(QUICK, 10)
    assert counts["sft/kept"] == len(kept) == 10
    by_id = {q.id: q for q in items}
    for traj in kept:
        q = by_id[traj.question_id]
        (title,) = chain_titles(q.meta["chain"])
        # `prefill: tags` wrote `<search>` and, with the one tool call spent, `<answer>`: the policy wrote the rest
        assert _policy_text(traj, tok) == f"{title}</search>{q.answers[0]}</answer>"
        assert traj.reward == 1.0 and traj.stop_reason == "answered"
        assert [c.args for c in traj.tool_calls] == [{"query": title}]
        assert traj.meta["tokenizer"].startswith("vocab-")


def test_oracle_writes_hermes_tool_calls_ending_with_eos():
    items, kept, _, tok = _collect([*QUICK, "agent.action_format=hermes"], 4)
    by_id = {q.id: q for q in items}
    assert len(kept) == 4
    for traj in kept:
        q = by_id[traj.question_id]
        call = json.dumps({"name": "search", "arguments": {"query": traj.tool_calls[0].args["query"]}})
        # `<tool_call>\n` was prefilled; the tool-call turn ends with EOS, the answer at `</answer>`
        assert _policy_text(traj, tok) == f"{call}\n</tool_call>{tok.eos_token}{q.answers[0]}</answer>"
        assert traj.reward == 1.0


def test_rft_keeps_the_policys_own_episodes_that_reach_the_reward_bar():
    from agent.workflow import make_workflow
    from serving.factory import build_engine
    from trainer.runtime import load_questions
    from trainer.sft_data import collect
    from world import with_world_index

    cfg = load_config("configs/quickstart.yaml", [*QUICK, "sft.source=rft", "sft.rft_samples=2", "agent.max_new_tokens=8"])
    items = load_questions(cfg)[0][:2]
    cfg, world = with_world_index(cfg)
    workflow, engine = make_workflow(cfg, world_dir=world), build_engine(cfg.engine)
    for bar, expect in ((0.0, 4), (1.5, 0)):  # every episode earns >= 0; none earns more than 1
        cfg.sft.rft_min_reward = bar
        kept, counts = asyncio.run(collect(cfg, items, workflow, engine))
        assert len(kept) == counts["sft/kept"] == expect and counts["sft/episodes"] == 4
    asyncio.run(workflow.aclose())


def test_oracle_follows_multi_hop_chains_through_read_turns():
    from serving.engines.oracle import chain_titles

    items, kept, counts, tok = _collect(MULTIHOP, 16)
    by_id = {q.id: q for q in items}
    assert len(kept) >= 12 and any(len(by_id[t.question_id].meta["chain"]) >= 2 for t in kept)
    for traj in kept:
        q = by_id[traj.question_id]
        text, titles = _policy_text(traj, tok), chain_titles(q.meta["chain"])
        expected = "".join(f"<search>{t}</search>Read about {t}.\n</think>" for t in titles)
        assert text == expected + f"<answer>{q.answers[0]}</answer>"
        assert traj.reward == 1.0 and [c.args["query"] for c in traj.tool_calls] == titles
    assert counts["sft/kept"] + counts["sft/dropped_incomplete"] + counts["sft/dropped_low_reward"] == 16


def test_oracle_answers_when_the_harness_prefills_answer_and_such_episodes_are_dropped():
    items, kept, counts, _ = _collect([*MULTIHOP, "agent.prefill=tags", "agent.max_tool_calls=1"], 16)
    multi = sum(len(q.meta["chain"]) > 1 for q in items)
    assert multi > 0 and counts["sft/dropped_incomplete"] >= multi  # answered before the chain's end: not kept
    assert all(len(t.tool_calls) == 1 for t in kept)


def test_sft_loss_is_the_token_mean_nll():
    from trainer.loss import sft_loss

    logp = torch.tensor([-0.5, -1.5, -2.0], requires_grad=True)
    loss, stats = sft_loss(logp, normalizer=6.0)
    assert loss.item() == pytest.approx(4.0 / 6.0) and stats.tokens == 3 and stats.nll_sum == pytest.approx(4.0)
    loss.backward()
    assert torch.allclose(logp.grad, torch.full((3,), -1 / 6.0))


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    """One tiny-random SFT run on oracle trajectories: the same 4 trajectories every step, so losses compare."""
    from hexsearch.commands.sft import run_sft

    root = tmp_path_factory.mktemp("sft")
    summary = run_sft("configs/quickstart.yaml", [*QUICK, f"run.root={root}", "run.name=s", "sft.max_items=4",
                                                  "sft.batch_size=4", "sft.epochs=4", "sft.eval_every=2",
                                                  "sft.lr=1e-3", "train.eval_questions=4", "train.precision=fp32"])
    return root / "s", summary


def test_sft_run_lowers_the_loss_and_writes_a_run_folder(sft_run, capsys):
    run, summary = sft_run
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["sft/loss"] for r in rows if "sft/loss" in r]
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert all(r["sft/tokens"] > 0 for r in rows if "sft/loss" in r)
    assert "eval/reward" in rows[0] and sum("eval/accuracy" in r for r in rows) == 3  # before, step 2, step 4
    assert summary["trajectories"] == 4 and summary["steps"] == 4 and summary["best_step"] in (2, 4)
    results = json.loads((run / "results.json").read_text())
    assert results["dev_reward_after"] == summary["dev_reward_after"]
    assert (run / "checkpoints" / "latest").read_text() == f"step-{summary['best_step']}"
    assert len(list((run / "checkpoints").glob("step-*"))) == 1  # only the best is kept
    lines = (run / "trajectories" / "sft.jsonl").read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[0])["meta"]["tokenizer"].startswith("vocab-")
    from hexsearch.commands.sft import result_line

    assert result_line(summary).startswith("RESULT sft dev_reward_before=")


def test_init_from_starts_learner_and_engine_from_the_sft_weights(sft_run, tmp_path):
    from hexsearch.commands.export import export_run
    from serving.engines.embedded import EmbeddedEngine
    from trainer import checkpoint
    from trainer.export import read_trained_weights
    from trainer.init_from import resolve_init_from
    from trainer.learner import Learner

    run, summary = sft_run
    saved = read_trained_weights(checkpoint.latest(run / "checkpoints"))
    name = "model.layers.0.self_attn.q_proj.weight"
    cfg = resolve_init_from(load_config("configs/quickstart.yaml", [*QUICK, f"train.init_from={run}"]))
    assert Path(cfg.engine.model) == (run / "artifacts" / f"policy-step-{summary['best_step']}").resolve()
    assert resolve_init_from(cfg).engine.model == cfg.engine.model  # idempotent: resume and train() repeat it
    learner = Learner(cfg.train, cfg.engine.model)
    assert torch.equal(dict(learner.model.named_parameters())[name].detach(), saved[name])
    engine = EmbeddedEngine(cfg.engine.model, dtype="float32", max_model_len=256)
    assert torch.equal(dict(engine.model.named_parameters())[name].detach(), saved[name])
    base = Learner(cfg.train, "tiny-random")
    assert not torch.equal(dict(base.model.named_parameters())[name].detach(), saved[name])
    exported = export_run(run, tmp_path / "hf", dtype="float32")  # `hexsearch export` takes an SFT run
    assert (exported / "model.safetensors").exists()
    # a run folder copied elsewhere (from a cluster, or a stage reused under another name) starts runs too:
    # its export names the old path, so it is made again in the copy
    import shutil

    from trainer.export import EXPORT_MARK

    moved = tmp_path / "moved"
    shutil.copytree(run, moved)
    cfg = resolve_init_from(load_config("configs/quickstart.yaml", [*QUICK, f"train.init_from={moved}"]))
    assert Path(cfg.engine.model) == (moved / "artifacts" / f"policy-step-{summary['best_step']}").resolve()
    mark = json.loads((Path(cfg.engine.model) / EXPORT_MARK).read_text())
    assert mark["checkpoint"].startswith(str(moved.resolve()))
    learner = Learner(cfg.train, cfg.engine.model)
    assert torch.equal(dict(learner.model.named_parameters())[name].detach(), saved[name])


def test_rl_takes_the_sft_runs_dev_evaluation_of_its_start_weights_only_when_made_the_same_way(sft_run):
    """`train.reuse_init_eval`: RL's evaluation before training would repeat the one the SFT run made of the
    checkpoint RL starts from (same weights, questions, settings), so it is read from that run's metrics; any
    setting that changes the evaluation's figures makes RL evaluate again, and says which."""
    from trainer.init_from import inherited_dev_eval, resolve_init_from

    def inherited(overrides: list[str]) -> tuple[dict, str]:  # the config as train() hands it over: init_from resolved
        return inherited_dev_eval(resolve_init_from(load_config("configs/quickstart.yaml", overrides)))

    run, summary = sft_run
    same = [*QUICK, f"train.init_from={run}", "train.eval_questions=4", "train.precision=fp32", "train.lr=1e-6"]
    figures, where = inherited(same)
    best = summary["best_step"]
    row = next(json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if json.loads(x)["step"] == best)
    assert where == f"{run} step {best}"
    assert figures == {k: v for k, v in row.items() if k.startswith("eval/")} and figures["eval/reward"] == summary["dev_reward_after"]
    # the rollouts' sampling temperature: the evaluation samples at train.eval_temperature, so it still counts
    assert inherited([*same, "agent.temperature=0.7"]) == (figures, where)
    for change, why in [("agent.max_turns=3", "agent settings differ"), ("tools.topk=2", "tools settings differ"),
                        ("engine.max_model_len=1536", "engine settings differ"),
                        ("train.eval_questions=5", "train settings differ"),
                        ("train.eval_temperature=0.7", "samples"), ("train.reuse_init_eval=false", "off")]:
        figures, where = inherited([*same, change])
        assert figures == {} and why in where, (change, where)
    assert "max_turns" in inherited([*same, "agent.max_turns=3"])[1]


@pytest.fixture(scope="module")
def six_epochs(tmp_path_factory) -> dict[int, dict]:
    """The metrics rows, by step, of sft_run's recipe trained for 6 epochs without a stop."""
    from hexsearch.commands.sft import run_sft

    root = tmp_path_factory.mktemp("sft6")
    run_sft("configs/quickstart.yaml", [*QUICK, f"run.root={root}", "run.name=u", "sft.max_items=4", "sft.batch_size=4",
                                        "sft.epochs=6", "sft.eval_every=2", "sft.lr=1e-3", "train.eval_questions=4",
                                        "train.precision=fp32"])
    rows = [json.loads(line) for line in (root / "u" / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows} | {-1: json.loads((root / "u" / "results.json").read_text())}


@pytest.mark.parametrize("ranks", [1, 2])
def test_resume_goes_on_from_the_kept_checkpoint_as_a_run_never_stopped(sft_run, six_epochs, tmp_path, ranks):
    """`hexsearch sft --resume RUN sft.epochs=6`: weights, Adam moments, step and data order come back from the
    kept (best) checkpoint, so every step after it matches a 6-epoch run that was never stopped; the steps after
    the checkpoint are done again and metrics.jsonl holds each step once. With `train.learner_workers=2` the
    one-rank checkpoint loads into two DDP ranks on Ray (LearnerGroup.load) and goes on the same way."""
    import shutil

    from hexsearch.commands.sft import run_sft

    run, summary = sft_run
    copy = tmp_path / "s"
    shutil.copytree(run, copy)
    more = [f"train.learner_workers={ranks}"] if ranks > 1 else []
    resumed = run_sft("sft.epochs=6", more, resume=str(copy))  # the CLI's first positional holds the override
    unbroken = six_epochs[-1]
    k = summary["best_step"]
    assert resumed["resumed_at_step"] == k and resumed["steps"] == unbroken["steps"] == 6
    assert resumed["best_step"] == unbroken["best_step"]
    assert resumed["dev_reward_before"] == summary["dev_reward_before"]
    rows = [json.loads(line) for line in (copy / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(7))
    for r in rows[1:]:
        assert r["sft/loss"] == pytest.approx(six_epochs[r["step"]]["sft/loss"], rel=1e-4), r["step"]
    assert rows[-1]["sft/loss"] < rows[1]["sft/loss"]
    assert (copy / "checkpoints" / "latest").read_text() == f"step-{resumed['best_step']}"


def test_resume_refuses_a_config_file_and_a_new_batch_size(sft_run):
    from hexsearch.commands.common import UserError
    from hexsearch.commands.sft import run_sft

    run, _ = sft_run
    with pytest.raises(UserError, match="sft.batch_size=2 differs from the run's 4"):
        run_sft("sft.batch_size=2", [], resume=str(run))
    with pytest.raises(UserError, match="not the config file"):
        run_sft("configs/quickstart.yaml", [], resume=str(run))


# --- refusals -------------------------------------------------------------------------------------

def _rows(sft_run) -> list[str]:
    return (sft_run[0] / "trajectories" / "sft.jsonl").read_text().splitlines()


def test_a_malformed_row_is_refused_naming_file_and_line(sft_run, tmp_path, tokenizer):
    from trainer.sft_data import SFTDataError, read_trajectories

    rows = _rows(sft_run)
    bad = json.loads(rows[1])
    bad["segments"][0]["loss_mask"] = bad["segments"][0]["loss_mask"][:-1]
    for i, broken in enumerate(['{"question_id": "x", ', json.dumps(bad), json.dumps({**bad, "colour": 1})]):
        path = tmp_path / f"t{i}.jsonl"
        path.write_text("\n".join([rows[0], "", broken]) + "\n")
        with pytest.raises(SFTDataError, match=rf"^{path}:3: not a trajectory: ") as e:
            read_trajectories(path, tokenizer)
        assert "\n" not in str(e.value)
    assert len(read_trajectories(sft_run[0] / "trajectories" / "sft.jsonl", tokenizer)) == 4


def test_a_file_of_another_tokenizer_is_refused(sft_run, tmp_path, tokenizer):
    from trainer.sft_data import SFTDataError, read_trajectories

    row = json.loads(_rows(sft_run)[0])
    row["meta"]["tokenizer"] = "vocab-32000-0123456789abcdef"
    path = tmp_path / "other.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(SFTDataError, match=r"other.jsonl:1: its token ids come from another tokenizer") as e:
        read_trajectories(path, tokenizer)
    assert "\n" not in str(e.value)


def test_an_sft_set_with_a_dev_question_is_refused(sft_run, tmp_path):
    from agent.qa import load_qa
    from hexsearch.commands.common import UserError
    from hexsearch.commands.sft import run_sft
    from world import QA_FILES, resolve_world

    cfg = load_config("configs/quickstart.yaml", QUICK)
    dev = load_qa(resolve_world(cfg.world) / QA_FILES["dev"])[0]
    rows = _rows(sft_run)
    for i, change in enumerate(({"question_id": dev.id}, {"question_id": "renamed", "question": f" {dev.question} "})):
        path = tmp_path / f"leak{i}.jsonl"
        path.write_text("\n".join([rows[0], json.dumps({**json.loads(rows[1]), **change})]) + "\n")
        with pytest.raises(UserError, match="1 trajectories are of dev or test questions .*dev questions never feed SFT"):
            run_sft("configs/quickstart.yaml", [*QUICK, f"run.root={tmp_path}", "sft.source=file", f"sft.data={path}"])


@pytest.mark.slow
def test_sft_on_oracle_trajectories_raises_greedy_dev_reward_with_smollm2(tmp_path):
    """SmolLM2-135M on the quickstart recipe (60-entity world): 8 steps of 8 oracle trajectories (~3 min on 2 cores;
    a run measured 0.370 -> 0.611 dev reward)."""
    from hexsearch.commands.sft import run_sft

    summary = run_sft("configs/quickstart.yaml", ["world.entities=60", f"run.root={tmp_path}", "run.name=s",
                                                  "sft.max_items=64", "sft.batch_size=8", "sft.max_steps=8",
                                                  "sft.eval_every=4", "sft.lr=2e-5", "train.eval_questions=18"])
    rows = [json.loads(line) for line in (tmp_path / "s" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["sft/loss"] for r in rows if "sft/loss" in r]
    assert sum(losses[-2:]) < sum(losses[:2])
    assert summary["dev_reward_after"] > summary["dev_reward_before"]
