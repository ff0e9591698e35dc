"""The CPU time a level-2 worker used against the threads its run records, measured by the judge.

An entry's code runs in the worker and may raise its thread count and widen its CPU affinity
(tests/training/test_entry_threads.py): no setting stops it. The judge reads the CPU time of the
entry's processes (d500.children.cpu_seconds: every thread, the reaped processes too) when the
clock starts and when training ends, and times the worker working (handing data, training
chunks, checkpoints, the finish); a run whose CPU time exceeds its recorded threads x the time
worked x its framework's bound (plus SLACK_S: the kernel counts CPU time in ticks) fails, its
ratio in the run's details (DETAIL) either way. Open: on a machine others keep busy the entry
gets less CPU than its threads want, and an entry on more threads may stay under the bound (the
seconds its live threads waited for a CPU, "waited_s", are recorded beside: summed over threads
they are no bound, an honest tensorflow run's exceeded its time worked 2.5 times); tensorflow's
and jax's bound (OTHERS) lets 3 threads through at --threads 1.
"""

from __future__ import annotations

import time
from typing import Any

from d500.errors import D500Error

DETAIL = "worker_cpu"
# CPU s / (threads x s worked) an honest run stays under, by the worker's framework. Measured
# (benchmarks/worker_cpu.py, README "What a worker's threads use", on a loaded machine): honest
# digits-mlp runs at --threads 1 and the default read up to 1.05 on torch (1.5 in a run that
# worked 0.06 s: 3 ticks over, SLACK_S's part; torch computes on the threads it is given alone),
# 0.99 on tensorflow and 0.94 on jax. TensorFlow runs its inter-op pool (as many threads again)
# and its Python thread beside the intra-op one, JAX its Python thread dispatching ahead of
# XLA's: both may use more than their threads honestly. An entry on 3 torch threads at
# --threads 1 may use up to 2 on two idle cores (not measured: the machine was never idle).
BOUND = {"torch": 1.3}
OTHERS = 3.0  # every other framework's
SLACK_S = 0.1  # CPU s over the bound an honest run may read (10 ticks of 10 ms)


def bound(backend: str) -> float:
    """The bound of a worker on `backend`."""
    from d500.backends import framework
    known = framework(backend)
    return BOUND.get(known[0] if known else backend, OTHERS)


class Meter:
    """The worker's CPU time and the wall time it worked in, for one run's check."""

    def __init__(self, worker: Any):
        job = getattr(worker, "job", None)  # a Worker's (level 3's ranks: not measured, open)
        self.threads = (getattr(job, "threads", None) or {}).get("count") or 0
        self.worker, self.worked = worker, 0.0
        self.bound = bound(job.backend) if self.threads else OTHERS
        self.start = worker.cpu_seconds() if self.threads else None

    def timed(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        """Call the worker's `call`, its wall time counted as worked."""
        t = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            self.worked += time.perf_counter() - t

    def check(self, run: Any) -> None:
        """Record the ratio on `run` (details DETAIL); raise a D500Error over the bound."""
        end = self.worker.cpu_seconds() if self.start is not None else None
        if self.start is None or end is None or self.worked <= 0:
            return
        used = end[0] - self.start[0]
        before = self.start[1]  # threads alive at both readings: the wait between them
        waited = sum(max(0.0, s - before.get(tid, 0.0)) for tid, s in end[1].items())
        ratio = used / (self.threads * self.worked)
        run.record(details={DETAIL: {"cpu_s": round(used, 3), "waited_s": round(waited, 3),
                                     "wall_s": round(self.worked, 3), "threads": self.threads,
                                     "ratio": round(ratio, 3), "bound": self.bound}})
        if used > self.bound * self.threads * self.worked + SLACK_S:
            raise D500Error(
                f"the worker's threads used {used:.2f} CPU s in {self.worked:.2f} s of work on "
                f"{self.threads} recorded thread(s): "
                f"{ratio:.2f}x, over the {self.bound}x an honest run stays under (the entry's code "
                "ran more threads than the run records)")
