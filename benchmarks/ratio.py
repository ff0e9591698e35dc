"""Side-by-side timing for the d500-vs-native benchmarks: interleaved repetitions, median ratio."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import numpy as np


def interleave(a: Callable[[], object], b: Callable[[], object], repetitions: int,
               number: int, clock: Callable[[], float] = time.perf_counter,
               ) -> tuple[list[float], list[float]]:
    """Per-call seconds of `a` and `b`, alternating which goes first in each repetition (`clock`:
    wall time by default; time.process_time counts this process's CPU time only)."""
    ta, tb = [], []
    for r in range(repetitions):
        order = [(a, ta), (b, tb)] if r % 2 == 0 else [(b, tb), (a, ta)]
        for fn, acc in order:
            start = clock()
            for _ in range(number):
                fn()
            acc.append((clock() - start) / number)
    return ta, tb


def report(label: str, d500_times: list[float], native_times: list[float], batch: int) -> float:
    """Print throughputs and the median per-repetition ratio d500/native with its IQR."""
    ratios = [n / d for d, n in zip(d500_times, native_times)]  # throughput d500 / native
    q = statistics.quantiles(ratios, n=4, method="inclusive")
    ratio = statistics.median(ratios)
    print(f"{label:<36} native {batch / statistics.median(native_times):8.1f}/s   "
          f"d500 {batch / statistics.median(d500_times):8.1f}/s   ratio d500/native "
          f"{ratio:.3f} (IQR {q[0]:.3f}-{q[2]:.3f}, {len(ratios)} reps)")
    return ratio


def compare(cases: dict[str, tuple[Callable[[], object], Callable[[], object]]],
            repetitions: int, number: int, batch: int) -> float:
    """Warm each (d500, native) pair of `cases` up (tracing, compiling), time them interleaved,
    print each ratio and the lowest; returns the lowest."""
    for d500_call, native_call in cases.values():
        d500_call(), native_call()
    ratios = {label: report(label, *interleave(d, n, repetitions, number), batch)
              for label, (d, n) in cases.items()}
    lowest = min(ratios.values())
    print(f"lowest ratio {lowest:.3f} (target >= 0.95)")
    return lowest


def agree(label: str, got: np.ndarray, expected: np.ndarray) -> bool:
    """Print `label` with the max relative difference of d500's output from native's; False
    (said on stderr) when it exceeds 1e-4, where a timing comparison would be meaningless."""
    err = float(np.max(np.abs(got - expected)) / (np.max(np.abs(expected)) + 1e-12))
    print(f"{label}; max relative output difference {err:.2e}")
    if err > 1e-4:
        print("outputs differ: the comparison would be meaningless", file=sys.stderr)
    return err <= 1e-4
