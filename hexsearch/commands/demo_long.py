"""`hexsearch demo-long` (`make demo-long`): the long-horizon recipe end to end on CPU.

    test  = the world's test split + its 4-hop test questions (world.unseen_hop_questions: never trained on)
    base  = eval(test, the base model)                  # greedy, per bucket: hops1..4, n2..n32
    sft   = hexsearch sft CONFIG                        # oracle episodes -> the best checkpoint on dev
    sft_e = eval(test, sft's best checkpoint)
    rl    = hexsearch train CONFIG train.init_from=sft  # async RL from the cold start
    rl_e  = eval(test, rl's final checkpoint)
    exact = check-logprobs(rl, the 4 longest trained episodes whose weights it kept)   # token-exact?
    RESULT long_horizon base=... sft=... rl=... acc_hops2_3=... acc_n8=... acc_n32=... base_n32=...
           tool_calls_first=... tool_calls_last=... max_turns=... minutes=...

Accuracy is exact match on the held-out test questions with greedy decoding (the eval harness's `world`
scorer); `overall`, and so base/sft/rl, is the test split's own, without the unseen-hop column. Tool calls
are the RL run's sampled episodes on the largest-N bucket at its first and last step; max_turns is the most
turns of any episode the RL run trained on; minutes is the command's wall clock (the sum of the stages' own
wall times, `stage_minutes`, when a rerun reused finished stages).
Each stage is its own `hexsearch` process and run folder (`<name>-base`, `-sft`, `-sft-test`, `-rl`,
`-rl-test`); rerunning with the same run.name reuses finished stages. The summary goes to
`<runs>/<name>-summary.json` (docs/training.md#long-horizon-search).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from hexsearch.commands.common import CONFIG_ARG, OVERRIDES_ARG, UserError, config_from_cli

LONG_CONFIG = "configs/long-horizon.yaml"


def _stage(root: Path, name: str, final: str, args: list[str]) -> Path:
    """Run one stage as its own `hexsearch` process (so each stage's memory goes back to the OS before the
    next one: an SFT learner and engine left in this process starved RL's Ray actors), unless its run folder
    already holds `final` (a stopped `demo-long` rerun with the same run.name resumes after its last
    finished stage). An SFT stage stopped after a checkpoint goes on from it (`hexsearch sft --resume`: the
    same steps as an unbroken run); any other unfinished stage starts again. Returns the stage's run folder."""
    run = root / name
    if (run / final).exists():
        typer.echo(f"{name}: done already ({run / final}); reused")
        return run
    command, source, overrides = args[0], [args[1]], args[2:]  # source: the config file, or the run resumed
    if command == "sft" and (run / "checkpoints" / "latest").exists():
        typer.echo(f"{name}: stopped after a checkpoint; going on from it")
        source = ["--resume", str(run)]
    elif run.exists():  # a stage that did not finish: start it again from nothing
        shutil.rmtree(run)
    done = subprocess.run([sys.executable, "-m", "hexsearch.cli", command, *source, *overrides, f"run.name={name}"],
                          check=False)
    if done.returncode != 0 or not (run / final).exists():
        raise UserError(f"demo-long: stage {name} failed (exit {done.returncode}); see {run}/log.txt")
    return run


def stage_minutes(run: Path, final: str) -> float:
    """A stage's wall time from its own files: config.yaml is written when it starts, `final` when it ends."""
    return ((run / final).stat().st_mtime - (run / "config.yaml").stat().st_mtime) / 60


def held_out_questions(cfg: Any, root: Path, name: str) -> tuple[str, list[str]]:
    """The file every test evaluation reads, `<runs>/<name>-test.jsonl`: the world's test split, then its
    unseen-hop questions (`world.unseen_hop_questions`: the 4-hop ones of a 3-hop recipe, which no stage
    trains on). Returns (path, the buckets of the unseen-hop questions)."""
    from agent.qa import question_bucket
    from world import QA_FILES, resolve_world, unseen_hop_questions

    test = (resolve_world(cfg.world) / QA_FILES["test"]).read_text(encoding="utf-8")
    try:
        unseen = unseen_hop_questions(cfg.world) if cfg.eval.unseen_hops else []
    except OSError as e:  # e.g. no room for the wider world beside a read-only world.out: the test split alone
        typer.echo(f"test: no unseen-hop questions ({e})")
        unseen = []
    path = root / f"{name}-test.jsonl"
    root.mkdir(parents=True, exist_ok=True)
    path.write_text(test.rstrip("\n") + "\n" + "".join(json.dumps(r) + "\n" for r in unseen), encoding="utf-8")
    return str(path), sorted({b for r in unseen if (b := question_bucket(r))})


def evaluate_test(root: Path, name: str, base_args: list[str], model: str, data: str,
                  unseen: list[str]) -> dict[str, Any]:
    """Greedy accuracy of `model` on the test questions `data` (held_out_questions): {"overall": avg@1,
    bucket: avg@1, ...} plus mean tool calls per bucket under `calls/<bucket>`. The `unseen` buckets get
    their columns but stay out of `overall`, so it is the test split's figure with or without them."""
    run = _stage(root, name, "report.json", ["eval", *base_args, "eval.suite=world", f"eval.data={data}",
                                              "eval.n=1", "eval.k=[1]", "eval.temperature=0", "eval.limit=0",
                                              f"engine.model={model}"])
    report = json.loads((run / "report.json").read_text(encoding="utf-8"))
    out = {"overall": report["overall"]["avg@1"], "run": str(run), "minutes": stage_minutes(run, "report.json")}
    buckets = report.get("groups", {}).get("bucket", {})
    for bucket, figures in buckets.items():
        out[bucket] = figures["avg@1"]
        out[f"calls/{bucket}"] = figures["mean"]["tool_calls"]
    seen = [g for b, g in buckets.items() if b not in unseen]
    if unseen and seen:
        out["overall"] = sum(g["questions"] * g["avg@1"] for g in seen) / sum(g["questions"] for g in seen)
    return out


def _policy_of(cfg: Any, run_dir: Path) -> str:
    """The exported policy folder of a run's newest checkpoint (the SFT's best; RL's final)."""
    from trainer.init_from import resolve_init_from

    return resolve_init_from(replace(cfg, train=replace(cfg.train, init_from=str(run_dir)))).engine.model


def _bucket_mean(figures: dict[str, Any], buckets: list[str]) -> float | None:
    got = [figures[b] for b in buckets if b in figures]
    return sum(got) / len(got) if got else None


def _largest_n(metrics: list[dict[str, Any]]) -> str | None:
    from agent.qa import bucket_order, is_bucket_name

    ns = {b for r in metrics for k in r if k.startswith("agent/tool_calls/n")
          for b in [k.rsplit("/", 1)[1]] if is_bucket_name(b)}
    return max(ns, key=bucket_order, default=None)


def rl_figures(run_dir: Path) -> dict[str, Any]:
    """Tool calls per episode on the largest-N bucket at the first and last RL step, and the most turns of
    any trained episode (from the run's metrics.jsonl and trajectories/)."""
    from trainer.metrics import read_metrics

    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "train/reward" in r]
    bucket = _largest_n(rows)
    key = f"agent/tool_calls/{bucket}"
    calls = [r[key] for r in rows if key in r]
    turns = 0
    for path in sorted((run_dir / "trajectories").glob("*.jsonl")):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    turns = max(turns, int(json.loads(line).get("num_turns", 0)))
                except (ValueError, AttributeError):
                    continue  # a torn last line of a killed run
    return {"bucket": bucket, "tool_calls_first": calls[0] if calls else None,
            "tool_calls_last": calls[-1] if calls else None, "max_turns": turns}


def token_exact(run_dir: Path, episodes: int = 4) -> dict[str, Any]:
    """The RL run's longest trained episodes re-scored by the weights that sampled them (trainer/logprob_check.py):
    only those whose every version the run kept weights for, so each checked token is checked."""
    from trainer.logprob_check import CheckError, check_run

    try:
        r = check_run(run_dir, limit=episodes, complete=True)
    except CheckError as e:
        return {"ok": False, "error": str(e)}
    return {**r.as_dict(), "episodes": len(r.episodes), "longest_turns": max(e.turns for e in r.episodes)}


def recipe_id(config_path: str | Path, overrides: list[str] | None) -> str:
    """Which recipe a run followed: a short hash of its YAML file's text and its overrides, leaving out where it
    ran (run.name, run.root), so recorded runs are compared, and their median taken, only within one recipe."""
    kept = sorted(o for o in overrides or [] if not o.startswith(("run.name=", "run.root=")))
    text = Path(config_path).read_text(encoding="utf-8") + "\n" + "\n".join(kept)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def result_line(s: dict[str, Any]) -> str:
    def f(x: Any) -> str:
        return "nan" if x is None else f"{x:.3f}"
    return (f"RESULT long_horizon base={f(s['base'])} sft={f(s['sft'])} rl={f(s['rl'])} "
            f"acc_hops2_3={f(s['acc_hops2_3'])} acc_n8={f(s['acc_n8'])} acc_n32={f(s['acc_n32'])} "
            f"base_n32={f(s['base_n32'])} tool_calls_first={f(s['tool_calls_first'])} "
            f"tool_calls_last={f(s['tool_calls_last'])} max_turns={s['max_turns']} minutes={s['minutes']:.1f}")


def run_long_demo(config: str | None, overrides: list[str] | None) -> dict[str, Any]:
    from hexsearch.commands.demo import world_line

    path = config or _long_config_path()
    cfg = config_from_cli(path, overrides)
    name = cfg.run.name or time.strftime("long-%Y%m%d-%H%M%S")
    root, args = Path(cfg.run.root), [path, *(overrides or [])]
    started = time.monotonic()
    resumed = any((root / f"{name}-{stage}").exists() for stage in ("base", "sft", "sft-test", "rl", "rl-test"))
    typer.echo(world_line(cfg))  # generates the world and its index once, before the stages
    test, unseen = held_out_questions(cfg, root, name)
    if unseen:
        typer.echo(f"test: the world's test split and its unseen-hop questions ({', '.join(unseen)}; no stage trains "
                   f"on them, and `overall` leaves them out) in {test}")

    def evaluate(stage: str, model: str) -> dict[str, Any]:
        return evaluate_test(root, f"{name}-{stage}", args, model, test, unseen)

    base = evaluate("base", cfg.engine.model)
    typer.echo(f"base: test accuracy {base['overall']:.3f} ({base['run']})")
    sft_run = _stage(root, f"{name}-sft", "results.json", ["sft", *args])
    sft_summary = json.loads((sft_run / "results.json").read_text(encoding="utf-8"))
    after_sft = evaluate("sft-test", _policy_of(cfg, sft_run))
    typer.echo(f"sft: best step {sft_summary['best_step']}, test accuracy {after_sft['overall']:.3f}")
    rl_run = _stage(root, f"{name}-rl", "results.json", ["train", *args, f"train.init_from={sft_run}"])
    rl_summary = json.loads((rl_run / "results.json").read_text(encoding="utf-8"))
    after_rl = evaluate("rl-test", _policy_of(cfg, rl_run))
    exact = token_exact(rl_run)
    typer.echo(f"token-exact: {exact['error']}" if "error" in exact else
               f"token-exact: {exact['ok']} ({exact['episodes']} longest trained episodes, up to {exact['longest_turns']} "
               f"turns, {exact['checked']} policy tokens, |diff| mean {exact['mean_diff']:.1e} max {exact['max_diff']:.1e})")
    stages = (base["minutes"] + stage_minutes(sft_run, "results.json") + after_sft["minutes"]
              + stage_minutes(rl_run, "results.json") + after_rl["minutes"])
    minutes = stages if resumed else (time.monotonic() - started) / 60
    summary = {"base": base["overall"], "sft": after_sft["overall"], "rl": after_rl["overall"],
               "acc_hops2_3": _bucket_mean(after_rl, ["hops2", "hops3"]), "acc_n8": after_rl.get("n8"),
               "acc_n32": after_rl.get("n32"), "base_n32": base.get("n32"), **rl_figures(rl_run),
               "minutes": minutes, "stage_minutes": stages, "rl_steps": rl_summary["steps"],
               "rl_stopped": rl_summary.get("stopped", ""), "sft_steps": sft_summary["steps"],
               "sft_best_step": sft_summary["best_step"], "tables": {"base": base, "sft": after_sft, "rl": after_rl},
               "token_exact": exact, "runs": {"sft": str(sft_run), "rl": str(rl_run)}, "unseen_buckets": unseen,
               "recipe": recipe_id(path, overrides),
               "code": str(Path(__file__).resolve().parents[2])}  # the source tree that ran (its commit is recorded)
    out = root / f"{name}-summary.json"
    out.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    typer.echo(table(summary["tables"], unseen))
    typer.echo(result_line(summary))
    return summary


def table(tables: dict[str, dict[str, Any]], unseen: list[str] | tuple[str, ...] = ()) -> str:
    """Markdown: accuracy and mean tool calls per bucket for base / SFT / SFT+RL (`unseen`: buckets no stage
    trained on, said so under the table)."""
    from agent.qa import bucket_order, is_bucket_name

    buckets = sorted({k for t in tables.values() for k in t if is_bucket_name(k)}, key=bucket_order)
    head = "| stage | overall | " + " | ".join(buckets) + " |"
    rows = [head, "|" + "---|" * (len(buckets) + 2)]
    for stage, t in tables.items():
        cells = [f"{t[b]:.2f} ({t.get('calls/' + b, 0):.1f})" if b in t else "" for b in buckets]
        rows.append(f"| {stage} | {t['overall']:.3f} | " + " | ".join(cells) + " |")
    note = f"; {', '.join(unseen)}: never trained on, not in overall" if unseen else ""
    return "\n".join(rows + [f"(accuracy, and in brackets mean tool calls per episode{note})"])


def _long_config_path() -> str:
    for base in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (base / LONG_CONFIG).exists():
            return str(base / LONG_CONFIG)
    raise UserError(f"{LONG_CONFIG} not found: run `hexsearch demo-long` from the repository root or pass a config")


def register(app: typer.Typer) -> None:
    @app.command("demo-long", help="The long-horizon recipe (what `make demo-long` runs): SFT cold start, async "
                                   "RL, and a held-out evaluation per bucket, ending with a RESULT line.")
    def _demo_long(config: str = CONFIG_ARG, overrides: list[str] = OVERRIDES_ARG) -> None:
        if config is not None and "=" in config and not Path(config).exists():
            overrides, config = [config, *(overrides or [])], None
        run_long_demo(config, overrides)
