"""`hexsearch demo`: the most complete main job that exists, on the embedded CPU default (`make demo`).

Today that is the offline world: generate it into a fresh run folder, print its summary, and walk
through one multi-hop question with the sentences on each chain article that answer it. (The
trainer issue turns this into a training run on that world.)
"""

from __future__ import annotations

import json

import typer

from hexsearch.commands.common import CONFIG_ARG, OVERRIDES_ARG, config_from_cli, open_run


def register(app: typer.Typer) -> None:
    @app.command("demo", help="Run the quickstart main job (what `make demo` runs).")
    def _demo(config: str = CONFIG_ARG, overrides: list[str] = OVERRIDES_ARG) -> None:
        from hexsearch.commands.world import print_samples, print_summary, run_generate

        cfg = config_from_cli(config, overrides)
        run = open_run(cfg, "demo")
        w = cfg.world
        out = run.path / "world"
        summary, seconds = run_generate(out, entities=w.entities, seed=w.seed, max_hops=w.max_hops,
                                        min_hops=w.min_hops, short_articles=w.short_articles,
                                        questions_per_entity=w.questions_per_entity, splits=tuple(w.splits))
        print_summary(summary, out, seconds)
        with open(out / "qa_dev.jsonl", encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
        want = min(3, w.max_hops)
        sample = [r for r in rows if r["type"] == "bridge" and r["hops"] == want][:1] or rows[:1]
        if sample:
            typer.echo("\nA sample dev question, with the sentence each chain article contributes:")
            print_samples(out, sample)
        run.write_json(run.results, {"world_dir": str(out), "world": summary, "seconds": round(seconds, 3),
                                     "sample": sample[0]["id"] if sample else None})
        typer.echo(f"\nrun folder: {run.path}")
