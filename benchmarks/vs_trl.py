"""hexsearch against a peer trainer, Hugging Face TRL's `GRPOTrainer` (agent training with tools), on the quickstart
task, for the same wall time on the same 2 cores.

Both arms train SmolLM2-135M-Instruct on the quickstart world's training questions with the quickstart recipe:
B=8 questions x G=4 samples at T=1.0, lr 3e-5 (AdamW, constant, grad clip 1), one search call per episode over
the same FAISS index (top-1, 160-character snippets), F1 reward with hexsearch's parser and format gate, at most
32 new tokens per model call. TRL's tool loop reads tool calls through the chat template's Hermes format, not
ASearcher's tags, so both arms use the Hermes format (`agent.action_format=hermes`): the quickstart's system
prompt and three worked examples written as `<tool_call>` / `<tool_response>`, and the same prefill
(`<tool_call>` opens the first turn, `<answer>` the turn after the result; in TRL through the generation prompt
of its chat template, see benchmarks/_trl_arm.py). TRL's search tool calls hexsearch's own search tool over a
loopback server run by this script, so both arms see the same result text.

- hexsearch arm: `hexsearch train` with the quickstart config in Hermes form and `train.time_budget_min=M`
  (setup and the first dev evaluation count against the budget).
- TRL arm: benchmarks/_trl_arm.py in .venv-trl (created by scripts/setup_trl.sh), stopped by the same rule:
  no new optimizer step after M minutes from process start.
- Trained samples/s = optimizer steps x B x G / seconds from the arm's process start to the end of its last
  step. Both arms count the same thing: the hexsearch arm runs with `train.filter_groups=none`, so, as in
  TRL, every step trains on the B x G episodes it generated, groups without reward variance included (with
  zero advantage). (Rounds recorded before this rule ran the quickstart's `filter_groups=drop`: each of our
  steps then trained on B kept groups out of more generated, a different quantity from TRL's.)
- Step time: each arm's steady-state step time (median of its steps after the first) and its split:
  hexsearch's trainer waiting for rollouts / training / syncing weights per step (rollouts run alongside
  training), TRL's generation (rollouts, tool calls, rewards) / the rest of the step (they run in turn).
- Every round records the commit and date it ran at.
- Dev reward: greedy mean F1 on the same 60 dev questions, by the same code (hexsearch's trainer evaluation,
  after its rollouts stopped): the hexsearch run's final evaluation, and for TRL a `hexsearch train
  engine.model=<TRL's final model> train.steps=0` run. Evaluation time is not in either arm's budget.

Arms run one after the other, never together, alternating which goes first over `--repeats` rounds. Prints
`RESULT vs_trl ratio=<our samples/s / TRL's> dev_reward_ours=<x> dev_reward_trl=<y> ...` (medians over
rounds) and writes benchmarks/results/vs_trl.json.

    .venv/bin/python benchmarks/vs_trl.py [--minutes 10] [--repeats 3] [--quick] [--lock /tmp/hexsearch-cpu.lock]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from _common import commit, fmt, kv, spread, write_result  # noqa: E402

HEX = ROOT / ".venv" / "bin" / "hexsearch"
TRL_PY = ROOT / ".venv-trl" / "bin" / "python"

# The quickstart's instruction and worked examples, in the Hermes tool-call format (same questions, same article).
SYSTEM = ('Answer questions with a search engine: call the search tool with <tool_call>{"name": "search", '
          '"arguments": {"query": "..."}}</tool_call>, read the <tool_response>, then write <answer>short answer</answer>.')
_VARNHOLT = "Varnholt is a city in the province of Qesmir. It was founded in 1642 by Dalia Orrent."
EXAMPLES = [("In what year was the city of Varnholt founded?", "Varnholt", _VARNHOLT, "1642"),
            ("Who founded Varnholt?", "Varnholt", _VARNHOLT, "Dalia Orrent"),
            ("What did Teodor Malk do for a living?", "Teodor Malk",
             "Teodor Malk was a glassblower born in Varnholt in 1601.", "glassblower")]


def hermes_config(out: Path) -> Path:
    """configs/quickstart.yaml with the agent in the Hermes format (everything else unchanged)."""
    cfg = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())
    agent = cfg["agent"]
    agent["action_format"] = "hermes"
    agent["system_prompt"] = SYSTEM
    agent["worked_example_text"] = "\n\n".join(
        f'Question: {q}\n<tool_call>\n{{"name": "search", "arguments": {{"query": "{query}"}}}}\n</tool_call>\n'
        f"<tool_response>\n[1] {query}\n{text}\n</tool_response>\n<answer>{answer}</answer>"
        for q, query, text, answer in EXAMPLES)
    path = out / "quickstart-hermes.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False, width=1000))
    return path


class ToolServer:
    """hexsearch's search tool (the one the agent uses, over the quickstart index) on loopback, for TRL's arm:
    POST /search {"query"} -> {"text"}: the text the hexsearch agent would show; GET /schema -> the tool schema."""

    def __init__(self, cfg):
        from agent.episode_tools import deliveries_for
        from agent.parser import ToolCall
        from tools.factory import open_toolset
        from world import resolve_world

        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        world = resolve_world(cfg.world)
        self.tools = self._run(open_toolset(cfg.tools, world_dir=world))
        tool = self.tools["search"]
        schema = dict(tool.schema)
        schema["function"] = {**schema.get("function", {}), "name": "search"}
        agent_cfg = cfg.agent

        async def search(query: str) -> str:
            call = ToolCall("search", {"query": query})
            obs = await tool(call.args)
            return deliveries_for(call, obs, 0, agent_cfg)[1][0].text

        run = self._run

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802
                self._reply(schema)

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self._reply({"text": run(search(str(body.get("query", ""))))})

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.server.shutdown()
        self._run(self.tools.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)


def _hexsearch(cfg_path: Path, root: Path, name: str, overrides: list[str], log: Path) -> tuple[Path, float]:
    run = root / "runs" / name
    t0 = time.time()
    with log.open("w") as f:
        proc = subprocess.run([str(HEX), "train", str(cfg_path), f"run.root={root / 'runs'}", f"run.name={name}",
                               *overrides], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                              env={**os.environ, "HEXSEARCH_QUIET": "1", "TOKENIZERS_PARALLELISM": "false"})
    if proc.returncode != 0:
        raise RuntimeError(f"hexsearch train ({name}) failed with exit code {proc.returncode}; see {log}")
    return run, t0


def _steps(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if "time/step_s" in r]


def ours_overrides(args) -> list[str]:
    """The hexsearch arm's settings on top of the quickstart: the time budget, B and G, and no group filter,
    so that each step trains on B x G generated episodes as TRL's does (module docstring)."""
    return [f"train.time_budget_min={args.minutes}", "train.steps=100000", "train.eval_every=0",
            "train.save_every=0", f"train.batch_size={args.batch}", f"train.group_size={args.group}",
            "train.filter_groups=none"]


def steady(step_s: list[float]) -> dict | None:
    """Median (min-max) of the step times after the first (warm-up: first compilation, caches); all of them
    when there is only one."""
    rest = step_s[1:] or step_s
    return spread(rest) if rest else None


def ours_timing(steps: list[dict]) -> dict:
    """The hexsearch arm's steady-state step time and, per step, the trainer's wait for rollouts, training
    and weight sync (medians after the first step)."""
    return {"step_s": steady([s["time/step_s"] for s in steps]),
            **{f"{k}_s": steady([s[f"time/{k}_s"] for s in steps if f"time/{k}_s" in s])
               for k in ("wait", "train", "sync")}}


def trl_timing(log: list[dict]) -> dict:
    """TRL's steady-state step time and, per step, generation (rollouts, tool calls, rewards) and the rest
    (loss, backward, optimizer), from its per-step log (`t` at each step's end and the cumulative
    `generation_s`). Differences of consecutive entries: steps 2.. only, as the first step's start is unknown."""
    def diffs(xs: list[float]) -> list[float]:
        return [b - a for a, b in zip(xs, xs[1:], strict=False)]

    step_s = diffs([x["t"] for x in log])
    gen = [x.get("generation_s") for x in log]
    gen_s = diffs(gen) if gen and None not in gen else []
    return {"step_s": spread(step_s) if step_s else None, "generation_s": spread(gen_s) if gen_s else None,
            "train_s": spread([s - g for s, g in zip(step_s, gen_s, strict=True)]) if gen_s else None}


def run_ours(cfg_path: Path, root: Path, r: int, args) -> dict:
    per_step = args.batch * args.group
    run, t0 = _hexsearch(cfg_path, root, f"ours-{r}", ours_overrides(args), root / f"ours-{r}.log")
    steps = _steps(run)
    results = json.loads((run / "results.json").read_text())
    train_s = steps[-1]["time"] - t0 if steps else float("nan")
    return {"steps": len(steps), "samples": len(steps) * per_step, "train_s": round(train_s, 1),
            "samples_per_s": len(steps) * per_step / train_s if steps else 0.0,
            "dev_reward": results["dev_reward_after"], "dev_reward_before": results["dev_reward_before"],
            "train_reward_last5": _mean([s["train/reward"] for s in steps[-5:]]),
            "kept_groups_mean": _mean([s["train/kept_groups"] for s in steps]), "timing": ours_timing(steps),
            "run": str(run)}


def run_trl(cfg_path: Path, cfg, server: ToolServer, root: Path, r: int, args) -> dict:
    from agent.qa import load_qa
    from world import resolve_world

    world = resolve_world(cfg.world)
    data = root / "trl_train.jsonl"
    if not data.exists():
        items = load_qa(cfg.train.data or world / "qa_train.jsonl")
        data.write_text("".join(json.dumps({"question": q.question, "golds": list(q.answers),
                                            "aug": list(q.aug_answers or [])}) + "\n" for q in items))
    agent_json = root / "agent.json"
    agent_json.write_text(json.dumps(yaml.safe_load(cfg_path.read_text())["agent"]))
    out = root / f"trl-{r}"
    log = root / f"trl-{r}.log"
    with log.open("w") as f:
        proc = subprocess.run([str(TRL_PY), str(ROOT / "benchmarks" / "_trl_arm.py"), "--model", str(args.model_dir),
                               "--data", str(data), "--agent", str(agent_json), "--tool-url", server.url,
                               "--out", str(out), "--batch", str(args.batch), "--group", str(args.group),
                               "--lr", str(cfg.train.lr), "--budget-s", str(args.minutes * 60),
                               "--seed", str(cfg.run.seed)],
                              cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                              env={**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "2"})
    if proc.returncode != 0:
        raise RuntimeError(f"TRL arm failed with exit code {proc.returncode}; see {log}")
    got = json.loads((out / "trl_arm.json").read_text())
    # Dev reward of TRL's final model: the same evaluation code and questions as the hexsearch run's final one.
    ev, _ = _hexsearch(cfg_path, root, f"trl-eval-{r}", [f"engine.model={out / 'model'}", "train.steps=0",
                                                         "train.time_budget_min=0"], root / f"trl-eval-{r}.log")
    results = json.loads((ev / "results.json").read_text())
    rewards = [x["reward"] for x in got["log"] if "reward" in x]
    return {"steps": got["steps"], "samples": got["samples"], "train_s": round(got["train_s"], 1),
            "samples_per_s": got["samples_per_s"], "setup_s": round(got["setup_s"], 1),
            "dev_reward": results["dev_reward_after"], "train_reward_last5": _mean(rewards[-5:]),
            "tool_calls": got["tool_calls"], "micro_batch": got["micro_batch"], "trl": got["trl"],
            "timing": trl_timing(got["log"])}


def _lock(path: str):
    """flock(2) on `path` while an arm runs (the same lock as `flock PATH command`); nothing when empty."""
    if not path:
        return contextlib.nullcontext()
    from tools.index import _file_lock

    return _file_lock(Path(path))


def round_record(order: list[str], got: dict) -> dict:
    """One round of both arms, with the ratio of trained samples/s and the commit and date it ran at."""
    return {"order": order, **got, "ratio": got["hexsearch"]["samples_per_s"] / got["trl"]["samples_per_s"],
            "commit": commit(), "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}


def _median_of(rounds: list[dict], arm: str, key: str) -> dict | None:
    """The spread over rounds of one arm's steady-state median `key` (None when no round has it)."""
    arm = "hexsearch" if arm == "ours" else arm
    vals = [x[arm]["timing"][key]["median"] for x in rounds if (x[arm].get("timing") or {}).get(key)]
    return spread(vals) if vals else None


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="wall-clock budget of each arm")
    ap.add_argument("--repeats", type=int, default=3, help="rounds of both arms, in alternating order")
    ap.add_argument("--batch", type=int, default=8, help="questions per step (B)")
    ap.add_argument("--group", type=int, default=4, help="samples per question (G)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 minutes per arm, 1 round")
    ap.add_argument("--lock", default="", help="hold this lock file (flock) while each arm runs, e.g. "
                    "/tmp/hexsearch-cpu.lock on a shared machine; released between arms")
    ap.add_argument("--keep", default="", help="keep the runs and logs in this folder (default: a temp folder); "
                    "a second call with the same folder continues after its finished rounds")
    args = ap.parse_args()
    if args.quick:
        args.minutes, args.repeats = 2.0, 1
    subprocess.run([str(ROOT / "scripts" / "setup_trl.sh")], check=True)

    from hexsearch.config import load_config
    from serving.models import SMOLLM2, resolve_model

    args.model_dir = resolve_model(SMOLLM2)
    tmp = None if args.keep else tempfile.TemporaryDirectory(prefix="vs_trl-")
    root = Path(args.keep or tmp.name)
    root.mkdir(parents=True, exist_ok=True)
    cfg_path = hermes_config(root)
    cfg = load_config(cfg_path, [])
    server = ToolServer(cfg)
    done = root / "rounds.json"
    rounds = json.loads(done.read_text())[: args.repeats] if args.keep and done.exists() else []  # --keep: resume
    try:
        for r in range(len(rounds), args.repeats):
            order = ["hexsearch", "trl"] if r % 2 == 0 else ["trl", "hexsearch"]
            got = {}
            for arm in order:
                with _lock(args.lock):
                    got[arm] = run_ours(cfg_path, root, r, args) if arm == "hexsearch" else run_trl(cfg_path, cfg, server, root, r, args)
                print(f"round {r + 1}/{args.repeats} {arm}: {got[arm]['steps']} steps, "
                      f"{got[arm]['samples_per_s']:.3f} samples/s, dev reward {got[arm]['dev_reward']:.3f}", flush=True)
            rounds.append(round_record(order, got))
            done.write_text(json.dumps(rounds, indent=1))  # finished rounds survive a failure (resumed with --keep)
    finally:
        server.close()
        if tmp is not None:
            tmp.cleanup()

    ratio = spread([x["ratio"] for x in rounds])
    ours_dev = spread([x["hexsearch"]["dev_reward"] for x in rounds])
    trl_dev = spread([x["trl"]["dev_reward"] for x in rounds])
    ours_sps = spread([x["hexsearch"]["samples_per_s"] for x in rounds])
    trl_sps = spread([x["trl"]["samples_per_s"] for x in rounds])
    base = spread([x["hexsearch"]["dev_reward_before"] for x in rounds])
    timing = {f"{arm}_{k}": _median_of(rounds, arm, k) for arm, keys in
              (("ours", ("step_s", "wait_s", "train_s", "sync_s")), ("trl", ("step_s", "generation_s", "train_s")))
              for k in keys}
    line = (f"RESULT vs_trl {kv('ratio', ratio)} {kv('dev_reward_ours', ours_dev, 3)} "
            f"{kv('dev_reward_trl', trl_dev, 3)} {kv('dev_reward_base', base, 3)} "
            f"{kv('trained_samples_per_s_ours', ours_sps, 3)} {kv('trained_samples_per_s_trl', trl_sps, 3)} "
            + " ".join(kv(k, v) for k, v in timing.items())
            + f" filter_groups=none minutes={args.minutes:g} rounds={len(rounds)}")
    details = {"rounds": rounds, "minutes": args.minutes, "batch": args.batch, "group": args.group,
               "format": "hermes", "model": SMOLLM2,
               "note": "one round: no spread" if len(rounds) == 1 else f"median of {len(rounds)} alternating rounds"}
    write_result("vs_trl", line, {"ratio": ratio, "dev_reward_ours": ours_dev, "dev_reward_trl": trl_dev,
                                  "trained_samples_per_s_ours": ours_sps, "trained_samples_per_s_trl": trl_sps,
                                  "dev_reward_base": base, "ours_step_s": timing["ours_step_s"],
                                  "trl_step_s": timing["trl_step_s"]}, details)
    print(f"ratio {fmt(ratio)}; dev reward ours {fmt(ours_dev, 3)}, TRL {fmt(trl_dev, 3)}")
    print(line)


if __name__ == "__main__":
    main()
