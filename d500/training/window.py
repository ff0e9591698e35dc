"""MLPerf's M > N seed runs: which N consecutive runs (in the rules' seed order) of the M a
workload lets an entry run are scored. Pure: figures in, a Choice out.

    choose([3.1, 2.9, inf, 3.4, 3.0, 3.2], n=3)   # -> Choice(start=3, ...): runs 3, 4, 5 score

MLPerf Training's rules (training_policies, training_rules.adoc, "it is also allowed to run M>N
independent runs as a group and to designate N consecutive runs from the group as the runs to be
used for scoring, provided that the submitter chooses the N consecutive runs that are closest to
the median result ... sets of N consecutive runs that would create an invalid benchmark result
should be included in the median calculation as "infinite" scores ... "consecutive" is defined
as an objective and deterministic method, such as submission timestamps"). d500 makes the choice
itself, from the ledger, never the sender:

- the M runs are ordered by their seed's index i in the rules' list (seed_of(..., i), i < M:
  d500.training.seeds.position), an order fixed before any run: a sender cannot move a run by
  re-dating it, renumbering the ledger or launching the seeds in an order of their choice;
- a run that did not meet the target (missed, diverged, failed, interrupted) is ∞; a required
  seed with no run at all is ∞ in the median too (no window holds it);
- the median is that of all M values (∞ included);
- each window of N consecutive runs has the mean of its values (∞ when it holds a miss);
- the window whose mean is closest to the median scores: |mean − median|, with ∞ − ∞ = 0 (an
  infinite window is exactly at an infinite median: the result is a miss, as MLPerf's "the
  entire result is invalid"); ties go to the earliest window (the smallest seed index).
With M = N there is one window, every run.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Choice:
    """The window that scores: runs [start, start + n) of the seed order, its mean, the
    median of the M, and one line saying why."""

    start: int
    n: int
    mean: float
    median: float
    reason: str

    def picks(self, i: int) -> bool:
        """Whether the run at position i of the seed order is one of the scored window."""
        return self.start <= i < self.start + self.n


def distance(mean: float, median: float) -> float:
    """|mean − median|, with ∞ − ∞ = 0 (an infinite window sits at an infinite median)."""
    if math.isinf(mean) and math.isinf(median):
        return 0.0
    return abs(mean - median)


def choose(values: Sequence[float], n: int, m: int | None = None) -> Choice:
    """The N consecutive values (in the seed order) whose mean is closest to the median of the M
    (`m`: the required count; values short of it are missing runs, ∞ in the median)."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    vals = [float(v) for v in values]
    m = max(m or len(vals), len(vals))
    median = float(statistics.median(vals + [math.inf] * (m - len(vals)))) if m else math.inf
    if len(vals) <= n:  # M = N (or fewer run): every run scores
        mean = sum(vals) / len(vals) if vals else math.inf
        return Choice(0, len(vals), mean, median,
                      f"all {len(vals)} run(s) score (the workload allows {m}, scores {n})")
    best: tuple[float, int, float] | None = None
    for start in range(len(vals) - n + 1):
        mean = sum(vals[start:start + n]) / n
        key = (distance(mean, median), start, mean)
        if best is None or key[:2] < best[:2]:
            best = key
    assert best is not None
    gap, start, mean = best
    return Choice(start, n, mean, median,
                  f"runs {start + 1}..{start + n} of {m} in the rules' seed order: their mean "
                  f"{_num(mean)} is the closest of {len(vals) - n + 1} windows to the median "
                  f"{_num(median)} of the {m} (a miss counts as ∞; ties: the earliest)")


def _num(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:.4g}"
