"""`hexsearch view [RUN_DIR ...] [--port P]`: browse run folders in a local web app.

    hexsearch view                          every run folder under runs/
    hexsearch view runs/train-20261204-164704 runs/eval-20261204-083325 --port 8377

Run pages (reward and dev-reward curves, rollout metrics, tool statistics; eval's per-question table;
datagen's accepted and rejected items), a trajectory page (timeline and token view: loss mask,
behaviour log-prob, weight version) and a group page (rewards and advantages side by side). Pages
update while a run is still writing. The server binds 127.0.0.1 and serves only the given folders.
"""

from __future__ import annotations

import typer

from hexsearch.commands.common import UserError


def register(app: typer.Typer) -> None:
    @app.command("view", help="Browse runs (train, eval, datagen, ask) in a local web app on 127.0.0.1.")
    def _cmd(runs: list[str] = typer.Argument(None, help="Run folders, or folders of runs (default: runs/)."),
             port: int = typer.Option(8377, "--port", help="Port on 127.0.0.1 (0: any free port)."),
             open_browser: bool = typer.Option(False, "--open", help="Open the page in the default browser.")) -> None:
        from hexsearch.viewer.runs import find_runs
        from hexsearch.viewer.server import ViewerServer

        try:
            folders = find_runs(runs or ["runs"])
        except FileNotFoundError as e:
            raise UserError(f"view: {e}") from None
        try:
            server = ViewerServer(folders, port=port)
        except OSError as e:
            raise UserError(f"view: cannot listen on 127.0.0.1:{port} ({e.strerror}); try --port 0") from None
        typer.echo(f"viewing {len(folders)} run(s) at {server.url}  (Ctrl-C stops)")
        server.warm_up()
        if open_browser:
            import webbrowser

            webbrowser.open(server.url)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.close()
