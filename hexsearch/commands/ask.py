"""`hexsearch ask "QUESTION" [CONFIG] [key=value ...]`: one agent episode with a live trace.

Runs the same workflow as training and evaluation (`train.workflow`, agent.workflow) with the configured engine and tools
(default: the embedded SmolLM2 over the offline world's local index), prints each thought, tool
call, result summary and the answer as they happen (`--quiet`: only the answer), and saves the
trajectory JSONL under `<run>/trajectories/ask.jsonl`. When the question is one of the world's
QA questions (or `--gold` is given) the answer is scored.

Without a config file, `ask` answers with the model a new user has: the newest checkpoint of a `make
demo` run under `runs/` (exported once to `<run>/artifacts/hf-step-N/`, with the run's own config),
and says so; else the untrained SmolLM2 with the quickstart's prompt recipe (configs/quickstart.yaml:
prefilled `<search>`/`<answer>` tags, worked examples), because small models do not act without it.
Decoding is greedy. `--checkpoint RUN_DIR` picks a training run explicitly; overrides on the command
line win (an `engine.model=` override skips the demo checkpoint). The trace ends with the command
that opens the episode in `hexsearch view`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import typer

from hexsearch.commands.common import CONFIG_ARG, OVERRIDES_ARG, UserError, config_from_cli, open_run

SMALL_MODEL_RECIPE = ["agent.prefill=tags", "agent.worked_example=true", "agent.lenient_tags=true",
                      "agent.read_search_results=false", "agent.max_tool_calls=1", "agent.temperature=0"]
"""Applied when no config file is given and configs/quickstart.yaml cannot be found."""
ASK_OVERRIDES = ["agent.temperature=0", "run.name=''"]
"""On top of a training run's or the quickstart's config: greedy, and a fresh `ask-<time>` run folder."""
VIEW_PORT = 8377


class TracePrinter:
    """Prints agent events as they happen (rich markup; nothing but the answer when quiet)."""

    def __init__(self, quiet: bool = False, console: Any = None):
        from rich.console import Console

        self.quiet = quiet
        self.console = console or Console(highlight=False)

    def __call__(self, e) -> None:
        from rich.markup import escape

        d, say = e.data, self.console.print
        if self.quiet:
            return
        if e.kind == "start":
            say(f"[bold]Question:[/bold] {escape(d['question'])}  [dim]({d['prompt_tokens']} prompt tokens)[/dim]")
        elif e.kind == "thought":
            say(f"[dim]  think[/dim] [italic]{escape(_short(d['text']))}[/italic]")
        elif e.kind == "notes":
            say(f"[dim]  notes {escape(_short(d['text']))}[/dim]")
        elif e.kind == "tool_call":
            args = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in d["args"].items())
            say(f"[cyan]  -> {escape(d['name'])}({escape(args)})[/cyan]")
        elif e.kind == "tool_result":
            style, what = ("red", f"error: {d['error']}") if d["error"] else ("green", d["summary"])
            parts = f", {d['parts']} parts" if d.get("parts", 1) > 1 else ""
            cached = ", cached" if d.get("cached") else ""
            say(f"[{style}]  <- {escape(_short(what, 140))}[/{style}] [dim]({d['latency_s'] * 1e3:.0f} ms{cached}{parts})[/dim]")
        elif e.kind == "format_error":
            say(f"[yellow]  format error: {escape('; '.join(d['errors']))}[/yellow]")
        elif e.kind == "compact":
            say(f"[dim]  (context full: {d['dropped']} oldest turns dropped)[/dim]")
        elif e.kind == "answer":
            say(f"[bold green]Answer:[/bold green] {escape(d['text'])}")
        elif e.kind == "stop" and d["reason"] != "answered":
            extra = f": {d['error']}" if d.get("error") else ""
            say(f"[bold red]Stopped ({escape(d['reason'] + extra)})[/bold red]")


def _short(text: str, n: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def find_world_item(world_dir: Path | None, question: str):
    """The world's QA item whose question is exactly `question` (gold answers for scoring), if any."""
    if world_dir is None:
        return None
    from agent.qa import load_qa

    for path in sorted(Path(world_dir).glob("qa_*.jsonl")):
        for item in load_qa(path):
            if item.question.strip() == question.strip():
                return item
    return None


async def ask_episode(question: Any, engine: Any, workflow: Any, *, printer: TracePrinter, seed: int = 0):
    """Run one traced episode through `workflow` (separate from the CLI so tests can drive it with any engine).
    Workflows that take an `on_event` callback (the search agent's) stream the trace live."""
    from agent.workflow import SearchAgentWorkflow

    live = {"on_event": printer} if isinstance(workflow, SearchAgentWorkflow) else {}
    return await workflow.arun_episode(engine, question, seed=seed, request_id=None, **live)


async def _run(question: str, cfg, quiet: bool, gold: list[str]) -> int:
    from agent.qa import QAItem
    from agent.workflow import make_workflow
    from serving.factory import build_engine

    run = open_run(cfg, "ask")
    printer = TracePrinter(quiet)
    from world import with_world_index

    cfg, world = with_world_index(cfg)
    item = find_world_item(world, question)
    if gold:
        item = QAItem(item.id if item else "ask", question, list(gold), [])
    if not quiet:
        printer.console.print(f"[dim]engine {cfg.engine.backend}:{cfg.engine.model}; tools "
                              f"{cfg.tools.search_backend}{' over ' + str(world) if world else ''}; run {run.path}[/dim]")
    workflow = make_workflow(cfg, world_dir=world)
    engine = build_engine(cfg.engine)
    try:
        traj = await ask_episode(item or question, engine, workflow, printer=printer, seed=cfg.run.seed)
    finally:
        await workflow.aclose()
        close = getattr(engine, "aclose", None)
        if close is not None:
            await close()
    out = run.trajectories / "ask.jsonl"
    with open(out, "a", encoding="utf-8") as fh:
        fh.write(traj.to_json() + "\n")
    summary = {"question": question, "prediction": traj.prediction, "stop_reason": traj.stop_reason,
               "turns": traj.num_turns, "tool_calls": len(traj.tool_calls), "reward": traj.reward,
               "gold": traj.gold, "timings": traj.timings, "trajectory": str(out)}
    run.write_json(run.results, summary)
    if quiet:
        typer.echo(traj.prediction if traj.prediction is not None else f"(no answer: {traj.stop_reason})")
    else:
        score = f"; reward {traj.reward:.2f} (gold: {' | '.join(traj.gold)})" if traj.gold else ""
        printer.console.print(f"[dim]{traj.num_turns} turns, {len(traj.tool_calls)} tool calls, "
                              f"{traj.timings['total']:.1f} s{score}; trajectory saved to {out}[/dim]")
        n = sum(1 for line in out.read_text(encoding="utf-8").splitlines() if line.strip()) - 1
        printer.console.print(f"[dim]see it in the viewer: hexsearch view {run.path} (then "
                              f"http://127.0.0.1:{VIEW_PORT}/#traj/0?file=ask.jsonl&n={n})[/dim]")
    return 0 if traj.stop_reason == "answered" else 1


def register(app: typer.Typer) -> None:
    @app.command("ask", help="Run one agent episode on a question and show the trace.")
    def _cmd(question: str = typer.Argument(..., help="The question to answer."),
             config: str = CONFIG_ARG, overrides: list[str] = OVERRIDES_ARG,
             quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the answer."),
             gold: list[str] = typer.Option(None, "--gold", help="A gold answer to score against (repeatable)."),
             checkpoint: str = typer.Option(None, "--checkpoint", help="Answer with this training run's newest "
                                            "checkpoint (a run folder or a step-N folder), with its config.")) -> None:
        has_file = config is not None and not ("=" in config and not Path(config).exists())
        if config is not None and not has_file:
            overrides, config = [config, *(overrides or [])], None
        cfg = _ask_config(config if has_file else None, list(overrides or []), checkpoint, quiet)
        try:
            code = asyncio.run(_run(question, cfg, quiet, list(gold or [])))
        except (ValueError, FileNotFoundError, RuntimeError) as e:
            raise UserError(f"ask: {e}") from e
        raise typer.Exit(code)


def _ask_config(config: str | None, overrides: list[str], checkpoint: str | None, quiet: bool):
    """The config `ask` runs with (see the module docstring), saying which model it chose."""
    from hexsearch.commands.demo import quickstart_path
    from hexsearch.commands.export import demo_export, find_checkpoint, newest_demo_run

    def say(text: str) -> None:
        if not quiet:
            typer.echo(text, err=True)

    if checkpoint is not None:
        run, _ = find_checkpoint(checkpoint)
        folder, step = demo_export(run) if Path(checkpoint) == run else _export_step(checkpoint)
        say(f"ask: the policy of {run} at {step} ({folder})")
        return config_from_cli(config or str(run / "config.yaml"),
                               [*([] if config else ASK_OVERRIDES), f"engine.model={folder}", *overrides])
    if config is not None:
        return config_from_cli(config, overrides)
    try:
        base, extra = quickstart_path(), ASK_OVERRIDES
    except UserError:
        base, extra = None, SMALL_MODEL_RECIPE
    cfg = config_from_cli(base, [*extra, *overrides])
    if not any(o.startswith("engine.model=") for o in overrides):
        demo = newest_demo_run(cfg.run.root)
        if demo is not None:
            folder, step = demo_export(demo)
            say(f"ask: using the model you trained: {demo} at {step} (the newest `make demo` run; "
                f"--checkpoint RUN_DIR picks another)")
            return config_from_cli(str(demo / "config.yaml"), [*ASK_OVERRIDES, f"engine.model={folder}", *overrides])
    say(f"ask: no trained `make demo` run under {cfg.run.root}/: the untrained {cfg.engine.model} with the "
        f"quickstart's prompt recipe ({base or 'built-in recipe'})")
    return cfg


def _export_step(checkpoint: str) -> tuple[Path, str]:
    """A step-N checkpoint folder exported once into its run's artifacts/hf-step-N/."""
    from hexsearch.commands.export import export_run
    from trainer.export import EXPORT_MARK

    step = Path(checkpoint)
    folder = step.parent.parent / "artifacts" / f"hf-{step.name}"
    if not (folder / EXPORT_MARK).exists():
        export_run(step, folder)
    return folder, step.name
