"""`hexsearch config show|keys`: print the resolved config, or every key with its documentation."""

from __future__ import annotations

import typer

from hexsearch.commands.common import CONFIG_ARG, OVERRIDES_ARG, config_from_cli
from hexsearch.config import describe, to_yaml

config_app = typer.Typer(help="Inspect configs.", no_args_is_help=True)


@config_app.command("show", help="Print the resolved config: defaults < YAML < key=value overrides.")
def show(config: str = CONFIG_ARG, overrides: list[str] = OVERRIDES_ARG) -> None:
    typer.echo(to_yaml(config_from_cli(config, overrides)), nl=False)


@config_app.command("keys", help="List every config key with its type and documentation.")
def keys(prefix: str = typer.Argument("", help="Only keys starting with this, e.g. train.")) -> None:
    for key, kind, doc in describe():
        if key.startswith(prefix):
            typer.echo(f"{key} ({kind}): {doc}")


def register(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")
