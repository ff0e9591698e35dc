"""What a worker's keeper costs its start (d500.children.keep): the split of a process holding
torch (as a level-2 worker does) into its keeper and the kept process, with the kept side in a
PID namespace of its own (unshare, then two forks: its pid 1 and the entry's process) against
the subreaper alone (one fork), interleaved pair by pair, each in a fresh spawned process.

Prints the median time from keep() called to keep() returned in the entry's process, per
kind, and their difference; the kind this kernel permits (a kernel refusing the namespace runs
the subreaper in both).

    .venv/bin/python benchmarks/keeper.py [--pairs 10]
"""

from __future__ import annotations

import argparse
import statistics
import time

from _spawned import result


def _split(queue, namespace: bool) -> None:
    import torch  # noqa: F401 - what a worker holds as it splits

    import d500.training.worker  # noqa: F401
    from d500 import children
    if not namespace:
        children._isolated = lambda: False
    t = time.perf_counter()  # CLOCK_MONOTONIC: one clock for every PID namespace
    kind = children.keep()
    queue.put((kind, time.perf_counter() - t))


def split(namespace: bool) -> tuple[str, float]:
    return result(_split, namespace)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10)
    args = parser.parse_args()
    times: dict[bool, list[float]] = {True: [], False: []}
    kinds = set()
    for i in range(args.pairs):
        for namespace in ((True, False) if i % 2 == 0 else (False, True)):
            kind, seconds = split(namespace)
            kinds.add(kind)
            times[namespace].append(seconds)
    ns, plain = statistics.median(times[True]), statistics.median(times[False])
    print(f"keeper kinds run: {', '.join(sorted(kinds))}")
    print(f"split, median of {args.pairs}: PID namespace {ns * 1e3:.2f} ms, subreaper alone "
          f"{plain * 1e3:.2f} ms, difference {(ns - plain) * 1e3:+.2f} ms")


if __name__ == "__main__":
    main()
