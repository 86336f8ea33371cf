"""`hexsearch demo`: the main job on the CPU default (`make demo`): multi-hop search in 15 minutes.

    base  = eval(test split, the base model)                  # greedy, per bucket: hops1, hops2
    sft   = hexsearch sft configs/multihop-demo.yaml          # oracle episodes -> the best checkpoint on dev
    rl    = hexsearch train ... train.init_from=sft           # 8 minutes of async RL from the cold start
    RESULT demo base=<x> sft=<x> rl=<x> acc_hops1=<x> acc_hops2=<x> minutes=<m>

The stages, run folders and summary are `hexsearch demo-long`'s (hexsearch/commands/demo_long.py) on a 1-2 hop
world; accuracy is exact match on the world's held-out test questions, greedy. It prints one line about the
offline world first. The RL-only quickstart (no cold start, one-hop questions) is
`hexsearch train configs/quickstart.yaml`; `hexsearch world generate` prints the full world summary.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from hexsearch.commands.common import CONFIG_ARG, OVERRIDES_ARG, UserError

QUICKSTART = "configs/quickstart.yaml"
DEMO = "configs/multihop-demo.yaml"


def shipped_config(relative: str) -> str:
    """A config the repository ships (`configs/...`), from the working directory, else from the source checkout."""
    for base in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (base / relative).exists():
            return str(base / relative)
    raise UserError(f"{relative} not found: run the command from the repository root or pass a config")


def quickstart_path() -> str:
    """configs/quickstart.yaml: the RL-only recipe, and the prompt recipe `hexsearch ask` falls back to."""
    return shipped_config(QUICKSTART)


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
    @app.command("demo", help="The main job (what `make demo` runs): SmolLM2 learns 1-2 hop search on the offline "
                              "world on CPU, by an SFT cold start then async RL, ending with a RESULT line.")
    def _demo(config: str = CONFIG_ARG, overrides: list[str] = OVERRIDES_ARG) -> None:
        from hexsearch.commands.demo_long import run_long_demo

        if config is not None and "=" in config and not Path(config).exists():
            overrides, config = [config, *(overrides or [])], None
        run_long_demo(config or shipped_config(DEMO), overrides, kind="demo")
