"""What a long command is working on, on stderr while it works (a big ledger's leaderboard takes
tens of seconds: verifying every run, each level's views, each board's plots; `d500 op bench`
validates, prepares each backend, then times them all; `d500 train` loads its framework); a
no-op where no one watches (`watched`: stderr no terminal) or outside `shown`."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar

_report: ContextVar[Callable[[str], None] | None] = ContextVar("progress_step", default=None)


@contextlib.contextmanager
def shown(title: str) -> Iterator[None]:
    """A spinner on stderr, with the elapsed time and the step `step` last named, while the
    block runs; erased when it ends (the board itself goes to stdout or a file)."""
    width = watched()
    if width is None or _report.get() is not None:
        yield
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    class Forwarded(Console):
        """An MPI rank's stderr, the launcher's pipe to a terminal: the cursor is never
        hidden, since a rank the launcher kills (another rank's MPI_Abort after ^C) never
        shows it again, and the person's shell had none."""

        def show_cursor(self, show: bool = True) -> bool:
            return False

    through = not sys.stderr.isatty()
    console = Forwarded(stderr=True, force_terminal=True, width=width) if through else \
        Console(stderr=True)
    bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                   console=console, transient=True, redirect_stdout=False,
                   redirect_stderr=False)
    task = bar.add_task(title, total=None)

    def report(text: str) -> None:
        bar.update(task, description=f"{title}: {text}")
        bar.refresh()  # each step is shown, however quickly the next one follows; and before
        #                a long import holds the interpreter (the spinner then stands still)

    with bar:
        token = _report.set(report)
        try:
            yield
        finally:
            _report.reset(token)


def step(text: str) -> None:
    """Say what the command does now (`verifying 114 runs`, `level 2: views`, `loading torch`)."""
    report = _report.get()
    if report is not None:
        report(text)


def watched() -> int | None:
    """The width of the terminal a person watches this process's stderr on, None where none
    does: stderr itself, or for an MPI rank (rank 0 only: the others print only errors) the
    terminal of the launcher that forwards the rank's stderr through a pipe (`mpiexec -n 2
    d500 train` said nothing for 9 s at load 4, while both ranks loaded torch)."""
    if sys.stderr.isatty():
        return _columns(sys.stderr.fileno())
    from d500.distributed.launch import launcher_rank
    width = behind_terminal()
    return width if launcher_rank() in (None, 0) else None


def behind_terminal() -> int | None:
    """The width of the terminal an MPI launcher forwards this rank's stderr to (None where
    stderr is itself a terminal, or no launcher started this process, or the launcher's stderr
    is no terminal). There a rank's line clears rank 0's spinner first (d500.say)."""
    from d500.distributed.launch import launched_by_mpi
    if not launched_by_mpi() or sys.stderr.isatty():
        return None
    return _launcher_terminal()


@functools.cache
def _launcher_terminal() -> int | None:
    """The width of the terminal behind the pipes this process's stderr goes through: the
    first ancestor (hydra's proxy, then mpiexec) whose stderr is no pipe, where it is a
    terminal; None otherwise, or where /proc does not say (not Linux, another user's, or a
    confined rank: d500.children.confine; so asked once, before, and kept)."""
    pid = os.getpid()
    for _ in range(8):  # a rank, its keeper and waiter, hydra's proxy, mpiexec
        try:
            link = os.readlink(f"/proc/{pid}/fd/2")
            if not link.startswith("pipe:"):
                fd = os.open(f"/proc/{pid}/fd/2", os.O_WRONLY | os.O_NOCTTY)
                try:
                    return _columns(fd) if os.isatty(fd) else None
                finally:
                    os.close(fd)
            with open(f"/proc/{pid}/stat") as stat:
                pid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
        if pid <= 1:
            return None
    return None


def _columns(fd: int) -> int:
    """The width of the terminal open as `fd` (80 where it does not say)."""
    try:
        return os.get_terminal_size(fd).columns or 80
    except OSError:
        return 80
