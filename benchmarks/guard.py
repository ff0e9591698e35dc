"""What a rank's seccomp filter (d500.distributed.guard) costs its system calls: the time of a
system call the filter lets through after walking all its tests (getppid), and of one it tests
and allows (kill(own pid, 0)), in a fresh spawned process with the filter loaded against one
without, interleaved pair by pair.

Prints the median ns per call of each kind, filtered and not, their ratio with the 95 % CI of
the median of the pairs' ratios (d500.timing.median_ci), and the machine's load.

    .venv/bin/python benchmarks/guard.py [--pairs 10] [--calls 200000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _spawned import result


def _measure(queue, filtered: bool, calls: int, protected: int) -> None:
    from d500 import children
    from d500.distributed import guard
    children.confine()  # no_new_privs, as a rank has set before its filter
    if filtered:
        assert guard.load([protected], [protected])
    me, out = os.getpid(), {}
    for name, call in (("getppid", os.getppid), ("kill(self, 0)", lambda: os.kill(me, 0))):
        t = time.perf_counter()
        for _ in range(calls):
            call()
        out[name] = (time.perf_counter() - t) / calls * 1e9
    queue.put(out)


def measure(filtered: bool, calls: int) -> dict[str, float]:
    return result(_measure, filtered, calls, os.getpid())


def main() -> None:
    from d500.timing import median_ci
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--calls", type=int, default=200_000)
    args = parser.parse_args()
    pairs: list[tuple[dict[str, float], dict[str, float]]] = []
    for i in range(args.pairs):
        order = (True, False) if i % 2 == 0 else (False, True)
        got = {f: measure(f, args.calls) for f in order}
        pairs.append((got[True], got[False]))
    print(f"load average {os.getloadavg()[0]:.2f}, {args.pairs} pairs of {args.calls} calls")
    for name in pairs[0][0]:
        on = statistics.median(p[0][name] for p in pairs)
        off = statistics.median(p[1][name] for p in pairs)
        ratios = [p[0][name] / p[1][name] for p in pairs]
        lo, hi = median_ci(ratios)
        print(f"{name}: filtered {on:.0f} ns, plain {off:.0f} ns, ratio "
              f"{statistics.median(ratios):.3f} (95 % CI {lo:.3f}-{hi:.3f})")


if __name__ == "__main__":
    main()
