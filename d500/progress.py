"""What a long command is working on, on stderr while it works (a big ledger's leaderboard takes
tens of seconds: verifying every run, each level's views, each board's plots; `d500 op bench`
validates, prepares each backend, then times them all); a no-op where no one watches (stderr
no terminal) or outside `shown`."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar

_report: ContextVar[Callable[[str], None] | None] = ContextVar("progress_step", default=None)


@contextlib.contextmanager
def shown(title: str) -> Iterator[None]:
    """A spinner on stderr, with the elapsed time and the step `step` last named, while the
    block runs; erased when it ends (the board itself goes to stdout or a file)."""
    if not sys.stderr.isatty() or _report.get() is not None:
        yield
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=True, redirect_stdout=False,
                   redirect_stderr=False)
    task = bar.add_task(title, total=None)

    def report(text: str) -> None:
        bar.update(task, description=f"{title}: {text}")
        bar.refresh()  # each step is shown, however quickly the next one follows

    with bar:
        token = _report.set(report)
        try:
            yield
        finally:
            _report.reset(token)


def step(text: str) -> None:
    """Say what the command does now (`verifying 114 runs`, `level 2: views`)."""
    report = _report.get()
    if report is not None:
        report(text)
