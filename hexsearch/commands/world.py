"""`hexsearch world generate|show|verify`: the offline fictional encyclopedia with multi-hop QA."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from hexsearch.commands.common import UserError

world_app = typer.Typer(help="Generate the offline world (corpus, pages, multi-hop QA).", no_args_is_help=True)


def run_generate(out: Path, **kw) -> tuple[dict, float]:
    """Generate a world with a progress bar (silenced by --quiet); returns (summary, seconds)."""
    from core.progress import progress
    from world import generate_world, work_units

    start = time.perf_counter()
    total = work_units(kw.get("entities", 400), kw.get("questions_per_entity", 3.0), kw.get("lineages", 0),
                       kw.get("lineage_length", 32), kw.get("lineage_depths"))
    with progress("building the world", total=total) as bar:
        def tick(n: int, stage: str) -> None:
            bar.update(description=stage)
            bar.advance(n)

        try:
            summary = generate_world(out, progress=tick, **kw)
        except ValueError as e:
            raise UserError(str(e)) from e
    return summary, time.perf_counter() - start


def print_summary(summary: dict, out: Path, seconds: float | None = None) -> None:
    """Tables of entities per type and questions per hops x type and per split."""
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    q = summary["questions"]
    ents = Table(title="entities", title_justify="left")
    for t in summary["entities"]:
        ents.add_column(t, justify="right")
    ents.add_column("total", justify="right")
    ents.add_row(*map(str, summary["entities"].values()), str(sum(summary["entities"].values())))
    qs = Table(title="questions", title_justify="left")
    qs.add_column("hops", justify="right")
    kinds = list(q["by_type"])
    for kind in kinds:
        qs.add_column(kind, justify="right")
    qs.add_column("total", justify="right")
    for hops, n in q["by_hops"].items():
        qs.add_row(hops, *(str(q["by_hops_type"].get(f"{hops}-{k}", 0)) for k in kinds), str(n))
    qs.add_row("all", *(str(q["by_type"][k]) for k in kinds), str(q["total"]))
    console.print(ents)
    console.print(qs)
    if "lineage" in q.get("by_family", {}):
        by_n = ", ".join(f"N={k.split('-')[1]} {v}" for k, v in q["by_family_n"].items() if k.startswith("lineage-"))
        console.print(f"lineage questions: {by_n} ({summary['lineage_people']} people in "
                      f"{summary['config']['lineages']} lineages of {summary['config']['lineage_length']})")
    splits = ", ".join(f"{s} {q['by_split'].get(s, 0)}" for s in ("train", "dev", "test"))
    took = f" in {seconds:.1f} s" if seconds is not None else ""
    console.print(f"splits: {splits}; {summary['pages']} pages, {summary['passages']} passages; seed {summary['seed']}")
    console.print(f"written to {out}{took}", soft_wrap=True)


def _load_rows(world_dir: Path, split: str) -> list[dict]:
    if not (world_dir / "world.json").exists():
        raise UserError(f"no world at {world_dir} (world.json missing); run `hexsearch world generate --out {world_dir}`")
    path = world_dir / f"qa_{split}.jsonl"
    if not path.exists():
        raise UserError(f"{path} does not exist (split must be train, dev or test)")
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def pick_samples(rows: list[dict], n: int, min_hops: int = 1) -> list[dict]:
    """Up to n questions, the first of each (hops, type) pair first, longest chains first."""
    order = sorted((r for r in rows if r["hops"] >= min_hops), key=lambda r: -r["hops"])
    firsts, rest, seen = [], [], set()
    for r in order:
        key = (r["hops"], r["type"])
        (rest if key in seen else firsts).append(r)
        seen.add(key)
    return (firsts + rest)[:n]


SHOWN_ENDS = 3
"""A long chain is printed as its first and last SHOWN_ENDS pages (a lineage of 32 would fill the screen)."""


def print_samples(world_dir: Path, rows: list[dict]) -> None:
    """Each question, its answer, and the sentence on each chain page that the answer rests on."""
    from world.reader import read_world, solve

    pages, kb, _ = read_world(world_dir)
    for r in rows:
        size = f"N={r['n']} ({r['min_searches']} searches)" if r.get("family") == "lineage" else f"{r['hops']}-hop"
        typer.echo(f"\n[{r['id']}] {size} {r['type']}: {r['question']}")
        typer.echo(f"  answer: {r['answer']}" + (f"  (also: {', '.join(r['aug_answer'][1:])})"
                                                 if len(r.get("aug_answer", [])) > 1 else ""))
        got = solve(r["program"], kb, set(r["chain"]))
        chain = r["chain"]
        for i, url in enumerate(chain, 1):
            if SHOWN_ENDS < i <= len(chain) - SHOWN_ENDS:
                if i == SHOWN_ENDS + 1:
                    typer.echo(f"  ... {len(chain) - 2 * SHOWN_ENDS} more pages, each naming the next master ...")
                continue
            typer.echo(f"  {i}. {url}")
            for fact in (got.evidence if got else []):
                if fact.url == url:
                    typer.echo(f"       {fact.sentence}")


@world_app.command("generate", help="Write corpus.jsonl, pages.jsonl, qa_{train,dev,test}.jsonl and world.json.")
def generate(
    out: Path = typer.Option(..., "--out", "-o", help="Output folder (created; world files in it are replaced)."),
    entities: int = typer.Option(400, "--entities", "-n", help="Number of entities (at least 20)."),
    seed: int = typer.Option(0, "--seed", "-s", help="Seed; the same seed gives byte-identical files."),
    max_hops: int = typer.Option(4, "--max-hops", help="Longest question, in articles to read (1-4)."),
    min_hops: int = typer.Option(1, "--min-hops", help="Shortest question, in articles to read."),
    short_articles: bool = typer.Option(False, "--short-articles", help="One lead paragraph per article."),
    easy: bool = typer.Option(False, "--easy", help="The CPU-scale task: --max-hops 1 --short-articles."),
    questions_per_entity: float = typer.Option(3.0, "--questions-per-entity", help="Questions per entity."),
    splits: str = typer.Option("0.8,0.1,0.1", "--splits", help="Train,dev,test fractions (by start entity)."),
    lineages: int = typer.Option(0, "--lineages", help="Lineages of masters for lineage questions (0: none)."),
    lineage_length: int = typer.Option(32, "--lineage-length", help="People per lineage, founder included (2-128)."),
    lineage_depths: str = typer.Option("", "--lineage-depths",
                                       help="The N asked per lineage, e.g. 2,4,8 (default: 2,4,8,16,32 up to the length)."),
) -> None:
    try:
        fractions = tuple(float(x) for x in splits.split(","))
    except ValueError as e:
        raise UserError(f"--splits must be three comma-separated numbers like 0.8,0.1,0.1, got {splits!r}") from e
    try:
        depths = [int(x) for x in lineage_depths.split(",")] if lineage_depths else None
    except ValueError as e:
        raise UserError(f"--lineage-depths must be comma-separated whole numbers like 2,4,8, got {lineage_depths!r}") from e
    if easy:
        max_hops, min_hops, short_articles = 1, 1, True
    summary, seconds = run_generate(out, entities=entities, seed=seed, max_hops=max_hops, min_hops=min_hops,
                                    short_articles=short_articles, questions_per_entity=questions_per_entity,
                                    splits=fractions, lineages=lineages, lineage_length=lineage_length,
                                    lineage_depths=depths)
    from core.progress import quiet

    if quiet():
        typer.echo(f"{out}: {sum(summary['entities'].values())} entities, "
                   f"{summary['questions']['total']} questions ({seconds:.1f} s)")
    else:
        print_summary(summary, out, seconds)


@world_app.command("show", help="Print sample questions with the chain articles and sentences that answer them.")
def show(
    world_dir: Path = typer.Argument(..., help="A world folder made by `hexsearch world generate`."),
    n: int = typer.Option(3, "--n", help="How many questions."),
    split: str = typer.Option("dev", "--split", help="train, dev or test."),
) -> None:
    print_samples(world_dir, pick_samples(_load_rows(world_dir, split), n))


@world_app.command("verify", help="Re-read every question from the article text: answerable from exactly its chain.")
def verify(world_dir: Path = typer.Argument(..., help="A world folder.")) -> None:
    from world.reader import verify_world

    _load_rows(world_dir, "train")
    report = verify_world(world_dir)
    typer.echo(f"{report['sound']}/{report['questions']} questions sound; {report['pages']} pages, "
               f"{report['unread_sentences']} unread sentences, {report['conflicts']} conflicting facts")
    for problem in report["problems"][:20]:
        typer.echo(f"  {problem}")
    if report["problems"] or report["sound"] != report["questions"]:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(world_app, name="world")
