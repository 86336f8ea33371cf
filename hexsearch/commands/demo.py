"""`hexsearch demo`: the main job on the CPU default (`make demo`): the quickstart training run.

It prints one line about the offline world it trains on, then trains the embedded SmolLM2 with
`configs/quickstart.yaml` (plus any overrides) and ends with
`RESULT train dev_reward_before=<x> dev_reward_after=<y> steps=<n> minutes=<m>`.
`hexsearch world generate` prints the full world summary.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from hexsearch.commands.common import CONFIG_ARG, OVERRIDES_ARG, UserError, config_from_cli

QUICKSTART = "configs/quickstart.yaml"


def quickstart_path() -> str:
    """configs/quickstart.yaml of the working directory, else of the source checkout."""
    for base in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (base / QUICKSTART).exists():
            return str(base / QUICKSTART)
    raise UserError(f"{QUICKSTART} not found: run `hexsearch demo` from the repository root or pass a config")


def world_line(cfg) -> str:
    """One line about the world a config trains on (generated and cached on first use)."""
    from world import resolve_world

    folder = resolve_world(cfg.world)
    info = json.loads((folder / "world.json").read_text(encoding="utf-8"))
    splits = info.get("questions", {}).get("by_split", {})
    counts = "/".join(str(splits.get(s, "?")) for s in ("train", "dev", "test"))
    return (f"world: {sum(info.get('entities', {}).values())} entities, {info.get('passages', '?')} articles, "
            f"questions train/dev/test {counts} ({folder})")


def register(app: typer.Typer) -> None:
    @app.command("demo", help="Run the quickstart main job (what `make demo` runs): train SmolLM2 on the "
                              "offline world on CPU, ending with a RESULT line.")
    def _demo(config: str = CONFIG_ARG, overrides: list[str] = OVERRIDES_ARG) -> None:
        from hexsearch.commands.train import run_training

        if config is not None and "=" in config and not Path(config).exists():
            overrides, config = [config, *(overrides or [])], None
        path = config or quickstart_path()
        typer.echo(world_line(config_from_cli(path, overrides)))
        run_training(path, overrides)
