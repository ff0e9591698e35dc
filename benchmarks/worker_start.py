"""What starting a level-2 worker costs, spawned against forked by d500's forkserver
(d500.children), interleaved in one process: the time from Worker(job) until the worker
translated the model and built the optimizer (`ready()`, before the run's clock starts), and a
whole digits-mlp `trainer.train` call's wall time per start method (--runs).

The forkserver's own start (an interpreter importing torch once per judge process) is printed
apart: a process's first run pays it, later runs do not.

    .venv/bin/python benchmarks/worker_start.py [--pairs 5] [--runs 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
METHODS = ("spawn", "forkserver")


def start(job, method: str) -> float:
    """Seconds from Worker(job) to ready() with `method`."""
    from d500 import children
    from d500.training.worker import Worker
    children.METHOD = method
    t = time.perf_counter()
    worker = Worker(job)
    try:
        worker.ready()
        return time.perf_counter() - t
    finally:
        worker.close()


def whole(workload, recipe, method: str) -> float:
    """Seconds of one digits-mlp trainer.train call with `method`."""
    from d500 import children
    from d500.ledger import Ledger
    from d500.training import trainer
    children.METHOD = method
    t = time.perf_counter()
    result = trainer.train(workload, recipe, "torch", 0, ledger=Ledger(), submission="bench")
    if result.status != "succeeded":
        raise SystemExit(f"the run {result.status}: {result.error}")
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=5, help="worker starts per method")
    p.add_argument("--runs", type=int, default=2, help="whole digits-mlp runs per method")
    args = p.parse_args()
    home = tempfile.TemporaryDirectory(prefix="d500-worker-start-")
    os.environ["D500_HOME"] = home.name
    from _digits import digits_job

    from d500 import children
    workload, recipe, job = digits_job()
    t = time.perf_counter()
    children.context(method="forkserver")
    first = start(job, "forkserver")
    print(f"load {os.getloadavg()[0]:.2f}; the forkserver's start and its first worker: "
          f"{time.perf_counter() - t:.2f} s (that worker alone {first:.2f} s)", flush=True)
    times: dict[str, list[float]] = {m: [] for m in METHODS}
    for _ in range(args.pairs):
        for method in METHODS:
            times[method].append(start(job, method))
    runs: dict[str, list[float]] = {m: [] for m in METHODS}
    for _ in range(args.runs):
        for method in METHODS:
            runs[method].append(whole(workload, recipe, method))
    s, f = (statistics.median(times[m]) for m in METHODS)
    print(f"worker start to ready, median of {args.pairs}: spawn {s:.2f} s, forkserver "
          f"{f:.2f} s (spawn/forkserver {s / f:.1f}x)")
    if args.runs:
        s, f = (statistics.median(runs[m]) for m in METHODS)
        print(f"a whole digits-mlp run, median of {args.runs}: spawn {s:.2f} s, forkserver "
              f"{f:.2f} s (forkserver/spawn {f / s:.3f})")
    print(f"load {os.getloadavg()[0]:.2f} at the end")
    home.cleanup()


if __name__ == "__main__":
    main()
