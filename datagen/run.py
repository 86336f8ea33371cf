"""A synthesis run: bounded concurrency, a checkpoint per item, then the dataset and its report.

    report = asyncio.run(run_datagen(cfg, out_dir))          # cfg: the whole HexConfig

Items (datagen/synth.py) run `datagen.concurrency` at a time, indices 0, 1, 2, ... until at
least `num_questions` are accepted (items that finish together are all kept) or `max_items` have been
attempted. Each finished item is appended to
`out/items.jsonl` (fsynced) the moment it ends: that file is the checkpoint. Running the same
command again resumes: indices already there are skipped (items that ended in `error` are retried),
so a killed run loses at most the items in flight and never writes one twice. Items still running
when the target is reached are cancelled and not written.

Then: `qa.jsonl` + splits (datagen/dataset.py: near-duplicates removed, split by answer), the
world's ground-truth check of every accepted question when the corpus is the world
(datagen/ground_truth.py), and `report.json`/`report.md` (datagen/report.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from core.checkpoint import append_row, read_rows
from core.log import get_logger
from core.progress import progress
from datagen.config import DatagenConfig, DatagenRunConfig

log = get_logger(__name__)
RUN_FILE = "run.json"


def max_items(dg: DatagenConfig) -> int:
    """The attempt budget: `max_items`, or 5 per wanted question."""
    return dg.max_items or 5 * dg.num_questions


def corpus_files(cfg: DatagenRunConfig) -> tuple[Path, Path | None]:
    """(pages file, world folder or None) of `datagen.corpus`."""
    if cfg.datagen.corpus == "world":
        from world import resolve_world

        world = resolve_world(cfg.world)
        return world / "pages.jsonl", world
    return Path(cfg.datagen.corpus), None


def _check_same_run(out: Path, settings: dict[str, Any]) -> None:
    """A resumed folder must have been made by the same pipeline settings (else its items would mix)."""
    path = out / RUN_FILE
    if path.exists():
        before = _flat(json.loads(path.read_text(encoding="utf-8")))
        now = _flat(json.loads(json.dumps(settings)))
        if before != now:
            changed = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
            raise ValueError(f"{out} holds a run with other settings ({', '.join(changed)}); "
                             "use a new --out folder or the same settings")
    else:
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings, indent=2, sort_keys=True), encoding="utf-8")


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as {"a.b.c": value}."""
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


ENGINE_RUNTIME_KEYS = ("urls", "device", "threads", "max_batch_size", "prefill_chunk_tokens", "kv_cache_gb",
                      "prefix_cache_gb", "request_timeout_s", "tensor_parallel_size")
"""`engine:` settings that say where and how fast the policy runs, not what it generates."""


def run_settings(cfg: DatagenRunConfig) -> dict[str, Any]:
    """Every setting that changes what a run generates, so a resumption with other ones is refused (not the
    targets and pace: `--n`, `max_items` and `concurrency` may change). The datagen models are in `datagen`;
    with `search_check` the search agent adds the policy engine, the agent, its tools and the workflow."""
    from dataclasses import asdict

    dg = asdict(cfg.datagen)
    for key in ("out", "num_questions", "max_items", "concurrency"):
        dg.pop(key)
    world = asdict(cfg.world) if cfg.datagen.corpus == "world" else None
    settings = {"datagen": dg, "world": world, "seed": cfg.run.seed}
    if cfg.datagen.search_check:
        engine = {k: v for k, v in asdict(cfg.engine).items() if k not in ENGINE_RUNTIME_KEYS}
        settings["search_agent"] = {"engine": engine, "agent": asdict(cfg.agent), "tools": asdict(cfg.tools),
                                    "workflow": cfg.train.workflow}
    return settings


def load_seeds(path: str | Path, store: Any) -> list[Any]:
    """The seed QAs of `datagen.seeds` (agent.qa.QAItem, `meta["pages"]` set from `pages` or `chain`);
    DataError for a row without source pages or with a url the corpus lacks."""
    from agent.qa import DataError, load_qa

    seeds = load_qa(path)
    for item in seeds:
        pages = item.meta.get("pages", item.meta.get("chain"))
        if not isinstance(pages, list) or not pages or not all(isinstance(u, str) for u in pages):
            raise DataError(f"{path}: seed '{item.id}' needs its source pages as 'pages' or 'chain' (a list of urls)")
        missing = [u for u in pages if u not in store.offsets]
        if missing:
            raise DataError(f"{path}: seed '{item.id}' names pages the corpus lacks: {', '.join(missing[:3])}")
        item.meta["pages"] = list(dict.fromkeys(pages))
    if not seeds:
        raise DataError(f"{path}: no seed questions")
    return seeds


async def run_items(synth: Any, out: Path, *, want: int, budget: int, concurrency: int) -> list[dict[str, Any]]:
    """Run items until `want` are accepted or `budget` attempted; returns every finished item, in index order."""
    path = out / "items.jsonl"
    rows = read_rows(path)
    finished = {r["index"]: r for r in rows if r.get("status") != "error"}
    errors = {r["index"]: r for r in rows if r.get("status") == "error"}  # the latest error of each index
    accepted = sum(r["status"] == "accepted" for r in finished.values())
    todo = (i for i in range(budget) if i not in finished)
    running: set[asyncio.Task] = set()
    with progress("datagen", total=want) as bar:
        bar.advance(min(accepted, want))

        def label() -> str:
            rejected = sum(r["status"] == "rejected" for r in finished.values())
            return f"datagen: {accepted} accepted, {rejected} rejected"

        bar.update(description=label())
        try:
            while accepted < want:
                while len(running) < concurrency and (index := next(todo, None)) is not None:
                    running.add(asyncio.ensure_future(synth.item(index)))
                if not running:
                    break
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    record = task.result()
                    append_row(path, record, sync=True)
                    if record["status"] == "error":
                        errors[record["index"]] = record
                        continue
                    finished[record["index"]] = record
                    if record["status"] == "accepted":
                        accepted += 1
                        bar.advance(1)
                bar.update(description=label())
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
    return [r for _, r in sorted({**errors, **finished}.items())]  # an index that finished later is not an error


async def run_datagen(cfg: DatagenRunConfig, out: str | Path, *, engine: Any = None, encode: Any = None) -> dict[str, Any]:
    """The whole run (see module docstring); returns the report. `engine` serves every model role instead
    of the configured backends (tests); `encode` replaces the MiniLM encoder of near-duplicate removal."""
    from datagen.corpus import PageStore
    from datagen.dataset import write_dataset
    from datagen.llm import open_models
    from datagen.report import write_report
    from datagen.synth import Synthesiser

    dg, out = cfg.datagen, Path(out)
    pages, world = corpus_files(cfg)
    _check_same_run(out, run_settings(cfg))
    store = PageStore.open(pages, links=dg.links if dg.link_source == "file" else None)
    seeds = load_seeds(dg.seeds, store) if dg.seeds else None
    models = open_models(dg, engine=engine)
    workflow = policy = None
    if dg.search_check:  # the search agent: the training workflow over the policy engine (`engine:`)
        from agent.workflow import make_workflow

        workflow = make_workflow(cfg, world_dir=world)
        policy = engine or _policy_engine(cfg, models)
    t0 = time.monotonic()
    try:
        synth = Synthesiser(dg, store, models, run_seed=cfg.run.seed, workflow=workflow, engine=policy,
                            seeds=seeds)
        items = await run_items(synth, out, want=dg.num_questions, budget=max_items(dg), concurrency=dg.concurrency)
    finally:
        if workflow is not None:
            await workflow.aclose()
        if policy is not None and policy not in models.owned and policy is not engine:
            await policy.aclose()
        await models.aclose()
    if encode is None and dg.dedup_threshold < 1.0 and any(r["status"] == "accepted" for r in items):
        from tools.encoder import Encoder

        encoder = Encoder("minilm")
        encode = lambda texts: encoder.encode(texts, kind="query")  # noqa: E731
    dataset = write_dataset(items, out, source=dg.source, fractions=dg.splits, seed=cfg.run.seed,
                            threshold=dg.dedup_threshold, encode=encode)
    truth = None
    if world is not None:
        from datagen.ground_truth import WorldTruth, summarise

        checker = WorldTruth(world)
        per_item = {r["id"]: checker.check(r) for r in items if r["status"] == "accepted"}
        truth = {"summary": summarise(list(per_item.values())), "per_item": per_item}
    info = {"corpus": str(pages), "models": models.names(), "seconds": round(time.monotonic() - t0, 1),
            "judge_calls": models.judge.counters["calls"], "difficulty_judge": dg.difficulty_judge,
            "min_hops": dg.min_hops, "max_edits": dg.max_edits, "solver_attempts": dg.solver_attempts,
            "max_solver_accuracy": dg.max_solver_accuracy, "actions": list(dg.actions)}
    return write_report(out, items, dataset=dataset, ground_truth=truth, info=info)


def _policy_engine(cfg: DatagenRunConfig, models: Any) -> Any:
    """The engine of the `engine:` section; an embedded policy that is the solver's model reuses its copy."""
    solver = cfg.datagen.solver
    if (cfg.engine.backend == "embedded" and solver.backend == "embedded" and cfg.engine.model == solver.model):
        return models.solver.transport
    from serving.factory import build_engine

    return build_engine(cfg.engine)
