"""What a worker's keeper costs its start (d500.children.keep): the split of a process holding
torch (as a level-2 worker does) into its keeper and the kept process, with the kept side in a
PID namespace of its own (unshare, then two forks: its pid 1 and the entry's process) against
the subreaper alone (one fork), interleaved pair by pair, each in a fresh spawned process.

Prints the median time from keep() called to keep() returned in the entry's process, per
kind, and their difference; the kind this kernel permits (a kernel refusing the namespace runs
the subreaper in both). `--hide`: instead, the namespace's split with the results directory
hidden (a $D500_HOME of a ledger file and a run's folder, made for the measurement) against the
same split with it read-only only (`children._skeleton` and `_hide_home` skipped).

    .venv/bin/python benchmarks/keeper.py [--pairs 10] [--hide]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from _spawned import result


def _split(queue, namespace: bool, hide: bool = True) -> None:
    import torch  # noqa: F401 - what a worker holds as it splits

    import d500.training.worker  # noqa: F401
    from d500 import children
    if not namespace:
        children._isolated = lambda *_: False
    took: list[float] = []

    def timed(step):  # (in the process that splits: the kept side inherits `took`)
        def run(*args):
            t = time.perf_counter()
            done = step(*args)
            took.append(time.perf_counter() - t)
            return done
        return run

    if hide:
        children._skeleton = timed(children._skeleton)
        children._hide_home = timed(children._hide_home)
    else:
        children._skeleton = lambda *_: None
    t = time.perf_counter()  # CLOCK_MONOTONIC: one clock for every PID namespace
    kind = children.keep()
    queue.put((kind, time.perf_counter() - t, sum(took)))


def split(namespace: bool, hide: bool = True) -> tuple[str, float, float]:
    return result(_split, namespace, hide)


def hiding(pairs: int) -> None:
    """The namespace's split with $D500_HOME hidden against read-only only, pair by pair."""
    with tempfile.TemporaryDirectory() as home:
        os.makedirs(os.path.join(home, "runs", "1"))
        for name in ("ledger.sqlite", os.path.join("runs", "1", "mllog.txt")):
            with open(os.path.join(home, name), "w") as f:
                f.write("x" * 4096)
        os.environ["D500_HOME"] = home
        times: dict[bool, list[float]] = {True: [], False: []}
        covers = []
        for i in range(pairs):
            for hide in ((True, False) if i % 2 == 0 else (False, True)):
                kind, seconds, cover = split(True, hide)
                times[hide].append(seconds)
                covers += [cover] if hide else []
        hidden, shown = statistics.median(times[True]), statistics.median(times[False])
        print(f"keeper kind: {kind}")
        print(f"split, median of {pairs}: results directory hidden {hidden * 1e3:.2f} ms, "
              f"read-only only {shown * 1e3:.2f} ms, difference {(hidden - shown) * 1e3:+.2f} ms;"
              f" the cover itself (children._skeleton and _hide_home) "
              f"{statistics.median(covers) * 1e3:.3f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--hide", action="store_true",
                        help="the cost of hiding the results directory instead")
    args = parser.parse_args()
    if args.hide:
        hiding(args.pairs)
        return
    times: dict[bool, list[float]] = {True: [], False: []}
    kinds = set()
    for i in range(args.pairs):
        for namespace in ((True, False) if i % 2 == 0 else (False, True)):
            kind, seconds, _ = split(namespace)
            kinds.add(kind)
            times[namespace].append(seconds)
    ns, plain = statistics.median(times[True]), statistics.median(times[False])
    print(f"keeper kinds run: {', '.join(sorted(kinds))}")
    print(f"split, median of {args.pairs}: PID namespace {ns * 1e3:.2f} ms, subreaper alone "
          f"{plain * 1e3:.2f} ms, difference {(ns - plain) * 1e3:+.2f} ms")


if __name__ == "__main__":
    main()
