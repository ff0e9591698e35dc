"""Start level-2 workers as d500 does (d500.training.worker: Worker(job), ready(), close()),
again and again, a few at once, and count those that end at their start ("the worker process
ended (exit code N) without a word"), each with the last error line the workers wrote on stderr
meanwhile (their stderr, and the forkserver's, goes to a file named at the end).

    .venv/bin/python benchmarks/worker_churn.py [--starts 100] [--start spawn] [--together 3]

A spawned worker (or the forkserver) imports d500 from disk as it starts: run this on a tree
that nobody edits meanwhile, or a half-saved edit is what it counts (README, "Workers that end
at their start").
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--starts", type=int, default=100, help="workers started in all")
    p.add_argument("--start", choices=("spawn", "forkserver"), default="spawn")
    p.add_argument("--together", type=int, default=3, help="workers started at once")
    args = p.parse_args()
    home = tempfile.TemporaryDirectory(prefix="d500-churn-")
    os.environ["D500_HOME"] = home.name
    log = tempfile.NamedTemporaryFile(prefix="d500-churn-stderr-", suffix=".log", delete=False)
    say = os.fdopen(os.dup(2), "w", buffering=1)
    os.dup2(log.fileno(), 2)  # the workers' stderr (and the forkserver's) goes to the file
    from _digits import digits_job

    from d500 import children
    from d500.training.worker import Worker, WorkerError
    children.METHOD = args.start
    _, _, job = digits_job()
    failed, started, t = 0, 0, time.perf_counter()
    say.write(f"load {os.getloadavg()[0]:.2f}; {args.starts} starts, {args.start}, "
              f"{args.together} at once\n")
    while started < args.starts:
        seen = os.path.getsize(log.name)
        batch = [Worker(job) for _ in range(min(args.together, args.starts - started))]
        started += len(batch)
        for worker in batch:
            try:
                worker.ready()
            except WorkerError as err:
                failed += 1
                with open(log.name, errors="replace") as f:
                    f.seek(seen)
                    why = [ln for ln in f.read().splitlines()
                           if re.match(r"[\w.]+(Error|Exception)\b", ln)][-1:]
                say.write(f"  start {started}: {err}{': ' + why[0] if why else ''}\n")
            finally:
                worker.close()
        if started % 10 < args.together:
            say.write(f"  {started} started, {failed} failed, {time.perf_counter() - t:.0f} s, "
                      f"load {os.getloadavg()[0]:.2f}\n")
    say.write(f"{failed} of {started} starts failed ({args.start}); load "
              f"{os.getloadavg()[0]:.2f} at the end; the workers' stderr: {log.name}\n")
    home.cleanup()


if __name__ == "__main__":
    main()
