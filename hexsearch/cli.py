"""`hexsearch` command line: one entry point for train, sft, ask, serve, index, tools, world, datagen, eval, plan, config,
view, export, check-logprobs.

Each command group lives in `hexsearch/commands/<group>.py` and registers itself on the app.
Heavy imports (torch, ray, faiss) happen inside the commands, so `hexsearch --help` is instant.
"""

from __future__ import annotations

import os
import sys

import typer

from hexsearch.commands import (
    ask,
    check_logprobs,
    config_cmd,
    datagen,
    demo,
    demo_long,
    eval_cmd,
    export,
    index,
    plan,
    serve,
    sft,
    tools_cmd,
    train,
    view,
    world,
)

app = typer.Typer(
    name="hexsearch", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    help="Train, evaluate and serve LLM search agents with fully asynchronous RL.")


@app.callback()
def _root(quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars or status output.")) -> None:
    if quiet:
        os.environ["HEXSEARCH_QUIET"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # transformers' per-load "Loading weights" bars say nothing a user needs; our own progress stays
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


for module in (train, sft, ask, serve, index, tools_cmd, world, datagen, eval_cmd, plan, config_cmd, demo, demo_long, view,
               export, check_logprobs):
    module.register(app)


def main() -> None:
    """Console-script entry point; user errors print one line and exit 2."""
    from hexsearch.commands.common import UserError

    try:
        app()
    except UserError as e:
        print(f"hexsearch: {e}", file=sys.stderr)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
