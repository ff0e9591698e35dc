"""Source text for the optimizers of parallel-tuning tests' entries: `meet()` makes the ranks'
first trials overlap, so every rank trains at least one trial however its start-up is scheduled
(a digits trial takes 0.05-0.5 s: rank 0 could finish them all before a rank that started a
second late asks for one)."""

from __future__ import annotations

MEET = '''
import os as _os
import time as _time
from pathlib import Path as _Path


def above(n):
    """The process `n` levels above this one, as the host sees it: a worker's keeper is 1 above
    (2 where the worker runs in a PID namespace of its own, its getppid() then 1: pid 1 there
    between; d500.children.keep)."""
    pid = "self"
    for _ in range(n):
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    return pid


def meet(step, ranks=2):
    """At the first update of a rank's first trial, when $D500_MEET_DIR is set: note the rank's
    process there (the parent of the worker that trains: the rank or its forkserver), then wait
    (at most 300 s) until `ranks` processes have."""
    folder = _os.environ.get("D500_MEET_DIR")
    if not folder or int(step) != 1:
        return
    mine = _Path(folder) / str(above(2 if _os.getppid() == 1 else 1))  # the worker's keeper
    if mine.exists():
        return
    mine.touch()
    deadline = _time.monotonic() + 300
    while len(list(_Path(folder).iterdir())) < ranks and _time.monotonic() < deadline:
        _time.sleep(0.01)
'''
