"""Waiting for a pipe message that is due: look without sleeping around its due time, a bounded
while, and block otherwise.

    ready = poll(conn, timeout=120.0, due=time.perf_counter() + 0.008)  # like conn.poll(120.0)

Judge and worker hand a chunk over and back every few milliseconds on digits-mlp, and a process
asleep in a blocking read took ~0.35 ms a hand-over to wake on a loaded VM, and ran slower for a
few ms after (README: "What the split costs"). Each side knows when its next message is due (the
judge times every round trip; the worker, the judge's answer). A wait expected to end within
SHORT s looks all along; a longer one blocks until EARLY s before the message is due. It looks
with `conn.poll(0)`, `os.sched_yield()` between looks (a runnable process on its CPU goes
first), until the message comes or `cap` s past its due time, then blocks. One wait spins at
most max(SHORT, EARLY) + `cap` s, however late the message. The due time decides only when a
side looks, never what is timed.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

SHORT = 0.003  # s: a wait expected to end sooner spins all along (the worker's: ~2 ms)
EARLY = 0.001  # s before a message is due that a longer wait starts looking without sleeping
CAP = 0.002  # s after it was due that the wait stops looking and blocks

_yield = getattr(os, "sched_yield", lambda: None)


def poll(conn: Any, timeout: float | None, due: float | None, cap: float = CAP) -> bool:
    """Whether `conn` has a message within `timeout` s (None: however long), as conn.poll;
    `due`: the time.perf_counter() reading at which one is expected (None, or `cap` <= 0: block
    all along), up to `cap` s past which the wait spins."""
    if due is None or cap <= 0:
        return conn.poll(timeout)
    now = time.perf_counter()
    end = math.inf if timeout is None else now + max(timeout, 0.0)
    spin_from = now if due - now <= SHORT else due - EARLY
    spin_to = min(due + cap, end)
    if spin_from > now and conn.poll(min(spin_from, end) - now):
        return True
    while time.perf_counter() < spin_to:
        if conn.poll(0):
            return True
        _yield()
    if end == math.inf:
        return conn.poll(None)
    return conn.poll(max(0.0, end - time.perf_counter()))
