"""Timing of repeated calls: warm-up, then repetitions until the 95% CI of the median is tight or a
time budget ends; median, IQR and a distribution-free confidence interval (levels 0 and 1 share it).

    from d500.timing import measure
    t = measure(lambda: exe.run(feeds), budget=2.0)
    t.median, t.iqr, t.ci, t.repetitions

A call shorter than `min_sample` seconds is repeated `number` times inside one timed sample (as
`timeit` does), so timer resolution and loop overhead never dominate; figures are per call.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

Z95 = 1.959963984540054


@dataclass
class Timing:
    """Per-call times of one measurement and their summary statistics (seconds)."""

    samples: list[float]
    number: int = 1  # calls per timed sample
    warmup: int = 0  # untimed calls before the first sample
    first_call: float | None = None  # the very first call (tracing, JIT, caches), if it was timed
    target_met: bool = False  # the CI reached the requested relative width
    budget_exhausted: bool = False
    rel_ci: float = 0.05
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def repetitions(self) -> int:
        return len(self.samples)

    @property
    def median(self) -> float:
        return float(statistics.median(self.samples))

    @property
    def mean(self) -> float:
        return float(statistics.fmean(self.samples))

    @property
    def quartiles(self) -> tuple[float, float]:
        if len(self.samples) < 2:
            return (self.samples[0], self.samples[0])
        q = statistics.quantiles(self.samples, n=4, method="inclusive")
        return (float(q[0]), float(q[2]))

    @property
    def iqr(self) -> float:
        q1, q3 = self.quartiles
        return q3 - q1

    @property
    def ci(self) -> tuple[float, float]:
        return median_ci(self.samples)

    @property
    def ci_halfwidth(self) -> float:
        """The larger distance from the median to either end of its 95% CI, relative to it."""
        lo, hi = self.ci
        med = self.median
        return max(med - lo, hi - med) / med if med > 0 else math.inf

    def summary(self) -> dict[str, Any]:
        """A JSON-friendly summary for a ledger run's details."""
        lo, hi = self.ci
        q1, q3 = self.quartiles
        return {"median": self.median, "mean": self.mean, "q1": q1, "q3": q3, "iqr": self.iqr,
                "ci95": [lo, hi], "ci95_rel": self.ci_halfwidth, "repetitions": self.repetitions,
                "number": self.number, "warmup": self.warmup, "first_call": self.first_call,
                "target_met": self.target_met, "budget_exhausted": self.budget_exhausted,
                "min": min(self.samples), "max": max(self.samples), **self.extra}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


UNSTABLE = 0.1  # interquartile range over median: above it, the repetitions spread widely


def unstable(summary: Any) -> bool:
    """Whether a Timing.summary() says its repetitions spread widely (interquartile range above
    UNSTABLE of the median; pyperf warns likewise when the standard deviation passes 10% of the
    mean, d500 takes the robust spread)."""
    if not isinstance(summary, dict):
        return False
    iqr, median = summary.get("iqr"), summary.get("median")
    return (isinstance(iqr, (int, float)) and isinstance(median, (int, float)) and median > 0
            and iqr / median > UNSTABLE)


def median_ci(samples: list[float], z: float = Z95) -> tuple[float, float]:
    """A distribution-free confidence interval of the median (order statistics; Le Boudec,
    "Performance Evaluation of Computer and Communication Systems", 2.1). With fewer than six
    samples the interval is (min, max), which is wide: the truth is that few samples say little."""
    xs = sorted(samples)
    n = len(xs)
    if n < 6:
        return (xs[0], xs[-1])
    lo = math.floor((n - z * math.sqrt(n)) / 2)
    hi = math.ceil(1 + (n + z * math.sqrt(n)) / 2)
    return (xs[max(lo - 1, 0)], xs[min(hi - 1, n - 1)])


def measure(fn: Callable[[], Any], *, budget: float = 2.0, warmup: int = 2,
            warmup_time: float = 0.1, min_repetitions: int = 6, max_repetitions: int = 1000,
            rel_ci: float = 0.05, min_sample: float = 1e-3, time_first: bool = False,
            sync: Callable[[], Any] | None = None,
            progress: Callable[[int], Any] | None = None) -> Timing:
    """Time `fn()`: `warmup` untimed calls (and at least `warmup_time` s of them), then timed
    samples until the 95% CI of the median is within `rel_ci` of it (after `min_repetitions`),
    `max_repetitions` is reached, or `budget` seconds of timing have passed. `sync` is called
    after each call inside the timed region (e.g. to wait for an asynchronous device).
    `time_first` times the very first call separately (it is then part of the warm-up)."""
    if budget <= 0:
        raise ValueError("budget must be positive")

    def once() -> float:
        t0 = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        return time.perf_counter() - t0

    first = once() if time_first else None
    done = 1 if time_first else 0
    warm_start = time.perf_counter()
    last = first if first is not None else 0.0
    while done < warmup or (time.perf_counter() - warm_start < warmup_time and done < 100):
        last = once()
        done += 1
    # Calls per sample, so that one sample lasts at least `min_sample` seconds.
    number = (1 if last >= min_sample or last <= 0
              else min(int(math.ceil(min_sample / last)), 10_000))
    samples: list[float] = []
    start = time.perf_counter()
    target = exhausted = False
    while True:
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        if sync is not None:
            sync()
        samples.append((time.perf_counter() - t0) / number)
        if progress is not None:
            progress(len(samples))
        n = len(samples)
        if n >= min_repetitions:
            t = Timing(samples)
            if t.ci_halfwidth <= rel_ci:
                target = True
                break
        if n >= max_repetitions:
            break
        if time.perf_counter() - start >= budget and n >= min(min_repetitions, 3):
            exhausted = True
            break
    return Timing(samples=samples, number=number, warmup=done, first_call=first,
                  target_met=target, budget_exhausted=exhausted, rel_ci=rel_ci)


def measure_interleaved(fns: dict[str, Callable[[], Any]], *, budget: float = 2.0,
                        warmup: int = 2, warmup_time: float = 0.1, min_repetitions: int = 6,
                        max_repetitions: int = 1000, rel_ci: float = 0.05,
                        min_sample: float = 1e-3,
                        progress: Callable[[str, int], Any] | None = None) -> dict[str, Timing]:
    """Time several callables side by side: after each one's warm-up, one sample of each in turn
    (the starting one rotating every round), so that a slow phase of the machine hits all of them
    alike. A callable stops being sampled once its CI is within `rel_ci` (after
    `min_repetitions`); all stop when `budget` seconds per callable have passed (after at least
    three samples each). Returns a Timing per name."""
    if budget <= 0:
        raise ValueError("budget must be positive")
    names = list(fns)
    numbers: dict[str, int] = {}
    warmed: dict[str, int] = {}
    for name in names:
        fn = fns[name]
        done, last, start = 0, 0.0, time.perf_counter()
        while done < warmup or (time.perf_counter() - start < warmup_time and done < 100):
            t0 = time.perf_counter()
            fn()
            last = time.perf_counter() - t0
            done += 1
        warmed[name] = done
        numbers[name] = (1 if last >= min_sample or last <= 0
                         else min(int(math.ceil(min_sample / last)), 10_000))
    samples: dict[str, list[float]] = {n: [] for n in names}
    met: dict[str, bool] = {n: False for n in names}
    start = time.perf_counter()
    total = budget * len(names)
    exhausted = False
    round_ = 0
    while True:
        active = [n for n in names if not met[n] and len(samples[n]) < max_repetitions]
        if not active:
            break
        shift = round_ % len(active)
        for name in active[shift:] + active[:shift]:
            fn, number = fns[name], numbers[name]
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            samples[name].append((time.perf_counter() - t0) / number)
            n = len(samples[name])
            if n >= min_repetitions and Timing(samples[name]).ci_halfwidth <= rel_ci:
                met[name] = True
            if progress is not None:
                progress(name, n)
        round_ += 1
        if (time.perf_counter() - start >= total
                and all(len(samples[n]) >= min(min_repetitions, 3) for n in names)):
            exhausted = any(not met[n] for n in names)
            break
    return {n: Timing(samples=samples[n], number=numbers[n], warmup=warmed[n],
                      target_met=met[n], budget_exhausted=exhausted and not met[n],
                      rel_ci=rel_ci) for n in names}
