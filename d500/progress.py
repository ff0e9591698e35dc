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
DRAWER_WAIT = 5.0  # s a block's end waits for the drawer to erase its line, then erases it


@contextlib.contextmanager
def shown(title: str) -> Iterator[None]:
    """A spinner on stderr, with the elapsed time and the step `step` last named, while the
    block runs; erased when it ends (the board itself goes to stdout or a file). A process of
    its own draws it (`_DRAW`), so it turns while this one's interpreter is held: a framework's
    import (TensorFlow's stood it still for 5 s at load 6) or a long call into C."""
    width = watched()
    if width is None or _report.get() is not None:
        yield
        return
    if behind_terminal() is not None:  # its Ctrl-C notice overwrites the whole line (_DRAW)
        width = min(width, LAUNCHER_WIDTH)
    import subprocess
    import threading
    encoding = (getattr(sys.stderr, "encoding", None) or "ascii").lower().replace("-", "")
    drawer = subprocess.Popen([sys.executable, "-I", "-S", "-c", _DRAW, str(width),
                               "utf8" if encoding == "utf8" else "ascii"],
                              stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, close_fds=True)
    lock = threading.Lock()

    def report(text: str) -> None:
        line = (f"{title}: {text}" if text else title).replace("\n", " ")
        with lock, contextlib.suppress(OSError, ValueError):  # a drawer gone: nothing shown
            drawer.stdin.write(line.encode("utf-8", "replace") + b"\n")
            drawer.stdin.flush()  # drawn within 0.1 s, before the next step holds this process

    report("")
    token = _report.set(report)
    try:
        yield
    finally:
        _report.reset(token)
        with lock, contextlib.suppress(OSError, ValueError):
            drawer.stdin.close()  # the drawer erases its line and ends: the next line is clear
        try:
            drawer.wait(timeout=DRAWER_WAIT)
        except subprocess.TimeoutExpired:  # a drawer starved of the CPU: this line erases
            drawer.kill()                 # what it drew last
            drawer.wait()
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write("\r\x1b[2K")
                sys.stderr.flush()


# The width the spinner's line is cut to under an MPI launcher (it fills one column less): within
# what the launcher's own Ctrl-C notice covers, written from the line's start (hydra's
# '^C[mpiexec@H] Sending Ctrl-C to processes as requested', 54 columns with a one-letter host,
# the terminal's echoed '^C' first)
LAUNCHER_WIDTH = 55

# The drawer: each line on stdin is the text to show, drawn at once; a frame every 0.1 s, cut
# to the terminal's width (a wrapped line is no longer erased by a carriage return), the text
# cut before the elapsed time; at the end of its input (the block ended, or this process died)
# the line is erased. ^C is the command's. Between frames the cursor waits at the line's start,
# so a line written by another (mpiexec's Ctrl-C notice, printed by mpiexec itself before the
# ranks hear of it) writes over the spinner instead of running on after its text.
_DRAW = r"""
import os, select, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
width, utf8 = int(sys.argv[1]), sys.argv[2] == "utf8"
frames = "\u280b\u2819\u2839\u2838\u283c\u2834\u2826\u2827\u2807\u280f" if utf8 else "|/-\\"
start, pending, n = time.monotonic(), b"", 0
def draw(text):
    global n
    s = int(time.monotonic() - start)
    clock = f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
    line = f"{text[:max(width - 4 - len(clock), 0)]} {clock}"[-max(width - 3, 1):]
    frame = f"\r\x1b[2K\x1b[32m{frames[n % len(frames)]}\x1b[0m {line}\r"
    os.write(2, frame.encode("utf-8" if utf8 else "ascii", "replace"))
    n += 1
text = ""
while True:
    if select.select([0], [], [], 0.1)[0]:
        data = os.read(0, 65536)
        if not data:
            break
        *lines, pending = (pending + data).split(b"\n")
        for each in lines:  # every step drawn, however quickly the next one follows
            text = each.decode("utf-8", "replace")
            draw(text)
        if lines:
            continue
    draw(text)
os.write(2, b"\r\x1b[2K")
"""


def step(text: str) -> None:
    """Say what the command does now (`verifying 114 runs`, `level 2: views`, `loading torch`)."""
    report = _report.get()
    if report is not None:
        report(text)


def watched() -> int | None:
    """The width of the terminal a person watches this process's stderr on, None where none
    does: stderr itself, or for an MPI rank (rank 0 only: the others print only errors) the
    terminal of the launcher that forwards the rank's stderr through a pipe (`mpiexec -n 2
    d500 train` said nothing for 9 s at load 4, while both ranks loaded torch). A dumb
    terminal (TERM=dumb: Emacs' shell) moves no cursor, so it is shown nothing."""
    if os.environ.get("TERM") == "dumb":
        return None
    if sys.stderr.isatty():
        return _terminal_width(sys.stderr.fileno())
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


# the MPI launchers whose own stderr is the terminal a rank's output is forwarded to
LAUNCHERS = ("mpiexec", "mpiexec.hydra", "mpirun", "orterun", "prterun", "srun")


@functools.cache
def _launcher_terminal() -> int | None:
    """The width of the terminal the MPI launcher's own stderr is: the launcher found among
    this process's ancestors (a rank, its keeper and waiter, hydra's proxy, mpiexec) by name;
    None where its stderr is no terminal (a test capturing mpiexec's output from a pytest at a
    terminal), or where /proc does not say (not Linux, another user's, or a confined rank:
    d500.children.confine; so asked once, before, and kept)."""
    pid = os.getppid()
    for _ in range(8):
        try:
            with open(f"/proc/{pid}/comm") as comm:
                name = comm.read().strip()
            if name in LAUNCHERS:
                fd = os.open(f"/proc/{pid}/fd/2", os.O_WRONLY | os.O_NOCTTY)
                try:
                    return _terminal_width(fd) if os.isatty(fd) else None
                finally:
                    os.close(fd)
            with open(f"/proc/{pid}/stat") as stat:
                pid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
        if pid <= 1:
            return None
    return None


def _terminal_width(fd: int) -> int:
    """The width of the terminal open as `fd` (80 where it does not say)."""
    try:
        return os.get_terminal_size(fd).columns or 80
    except OSError:
        return 80
