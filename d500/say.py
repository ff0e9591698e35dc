"""One line on stderr, written whole (its newline included) in one write and, under an MPI
launcher, prefixed with the rank, so the lines of ranks failing together never run into one."""

from __future__ import annotations

import os
import sys


def shown(text: str) -> str:
    """Text a sender wrote (a name, a figure's name, a CPU model, an exception's words) as d500
    prints it: each control or invisible character as its escape, newlines kept, so a
    terminal's escapes in it cannot erase or rewrite the lines around it (a figure named
    "ESC[2K CR ... passed ... ESC[8m" made `d500 check`'s failing line read "passed")."""
    return "".join(c if c.isprintable() or c == "\n" else ascii(c)[1:-1] for c in text)


def rank_prefix() -> str:
    """'[rank N] ' in a process an MPI launcher started with other ranks, else ''."""
    from d500.distributed.launch import launcher_rank
    rank = launcher_rank()
    return "" if rank is None else f"[rank {rank}] "


def say(line: str) -> None:
    """Write `line` and its newline on stderr (fd 2) in one write(2) call: a pipe takes up to
    PIPE_BUF bytes whole, so a launcher reading several ranks' pipes never gets half a line;
    print() writes the text and its newline apart, and two ranks' lines ran together."""
    text = rank_prefix() + line.rstrip("\n") + "\n"
    if text.startswith("[rank "):
        from d500.progress import behind_terminal
        if behind_terminal() is not None:  # rank 0's spinner may be on the terminal's line
            text = "\r\x1b[2K" + text  # (d500.progress): the line starts clear, not after it
    stream = sys.stderr
    if stream is not sys.__stderr__:  # redirected in-process (a test's capture): one write
        stream.write(text)
        stream.flush()
        return
    try:
        stream.flush()  # what was printed before comes first
    except (OSError, ValueError):
        pass
    data = text.encode("utf-8", "replace")
    try:
        while data:
            data = data[os.write(2, data):]
    except OSError:
        pass
