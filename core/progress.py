"""Rich progress bars and console output that honour `--quiet` (leaf module).

`hexsearch --quiet` sets HEXSEARCH_QUIET=1; every long-running piece of work in any package
uses `progress()` so one flag silences them all, including inside Ray workers (env is inherited).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def quiet() -> bool:
    """True when the user asked for no progress output."""
    return os.environ.get("HEXSEARCH_QUIET", "") not in ("", "0")


def console() -> Console:
    """A console on stderr, silenced by --quiet (results and RESULT lines go to stdout)."""
    return Console(stderr=True, quiet=quiet())


class _Task:
    """Handle returned by `progress()`: call `advance(n)` as work completes."""

    def __init__(self, bar: Progress | None, task_id):
        self._bar, self._id = bar, task_id

    def advance(self, n: float = 1) -> None:
        if self._bar is not None:
            self._bar.advance(self._id, n)

    def update(self, **kw) -> None:
        if self._bar is not None:
            self._bar.update(self._id, **kw)


@contextlib.contextmanager
def progress(description: str, total: float | None = None) -> Iterator[_Task]:
    """A progress bar for one long task; a no-op under --quiet or when stderr is not a TTY-like stream."""
    if quiet():
        yield _Task(None, None)
        return
    bar = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TimeRemainingColumn(), console=Console(stderr=True), transient=not sys.stderr.isatty(),
    )
    with bar:
        yield _Task(bar, bar.add_task(description, total=total))
