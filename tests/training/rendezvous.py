"""Source text for the optimizers of parallel-tuning tests' entries: `meet()` makes the ranks'
first trials overlap, so every rank trains at least one trial however its start-up is scheduled
(a digits trial takes 0.05-0.5 s: rank 0 could finish them all before a rank that started a
second late asks for one)."""

from __future__ import annotations

MEET = '''
import os as _os
import time as _time
from pathlib import Path as _Path


def who():
    """The d500 process a worker trains for: its MPI rank (hydra's PMI_RANK, in the environment
    a worker takes from that process), else "0". (Not read from /proc: a worker in a PID
    namespace of its own has a /proc of its own, where nothing above its namespace shows.)"""
    return _os.environ.get("PMI_RANK", "0")


def meet(step, ranks=2):
    """At the first update of a rank's first trial, when $D500_MEET_DIR is set: note the rank
    there, then wait
    (at most 300 s) until `ranks` processes have."""
    folder = _os.environ.get("D500_MEET_DIR")
    if not folder or int(step) != 1:
        return
    mine = _Path(folder) / who()
    if mine.exists():
        return
    mine.touch()
    deadline = _time.monotonic() + 300
    while len(list(_Path(folder).iterdir())) < ranks and _time.monotonic() < deadline:
        _time.sleep(0.01)
'''
