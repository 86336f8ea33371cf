"""`hexsearch datagen`: synthesise hard, verified multi-hop QA with the QA-synthesis agent.

    hexsearch datagen --out runs/qa                               # the offline world, embedded model
    hexsearch datagen configs/datagen/wiki-vllm.yaml --out runs/wiki-qa --n 1000
    hexsearch datagen --out runs/qa --n 40                        # same folder: resume, then go on to 40

Writes `OUT/qa.jsonl` (+ `qa_train/dev/test.jsonl`), `OUT/items.jsonl` (every item, the checkpoint),
`OUT/report.json` and `OUT/report.md`, and ends with one line
`RESULT datagen attempted=... accepted=... kept=... acceptance=... verified=... tokens=... minutes=...`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from hexsearch.commands.common import CONFIG_ARG, OVERRIDES_ARG, UserError, config_from_cli


def register(app: typer.Typer) -> None:
    @app.command("datagen", help="Synthesise hard, verified multi-hop QA (fuzz + inject edits, validity, "
                                 "difficulty and uniqueness checks) from the offline world or any corpus.")
    def _cmd(
        config: str = CONFIG_ARG, overrides: list[str] = OVERRIDES_ARG,
        out: str = typer.Option(None, "--out", help="Output folder; an existing one is resumed."),
        n: int = typer.Option(None, "--n", help="Accepted questions to produce (datagen.num_questions)."),
    ) -> None:
        from agent.qa import DataError
        from core.log import setup_logging
        from datagen.report import result_line
        from datagen.run import run_datagen

        flags = [f"datagen.num_questions={n}"] if n is not None else []
        cfg = config_from_cli(config, [*(overrides or []), *flags])
        folder = out or cfg.datagen.out
        if not folder:
            raise UserError("datagen: say where to write: --out DIR (or datagen.out=DIR)")
        Path(folder).mkdir(parents=True, exist_ok=True)
        setup_logging(cfg.run.log_level, Path(folder) / "datagen.log")
        try:
            report = asyncio.run(run_datagen(cfg, folder))
        except (DataError, ValueError, FileNotFoundError) as e:
            raise UserError(f"datagen: {e}") from None
        typer.echo((Path(folder) / "report.md").read_text(encoding="utf-8"))
        typer.echo(result_line(report))
