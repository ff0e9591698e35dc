"""AlgoPerf's performance profile, the one implementation every level's summary uses: "times the
best" per workload, rho(tau) and its normalised integral up to TAU_MAX, and the geometric mean.

    p = profile.build({"a": {"w1": 1.0, "w2": 3.0}, "b": {"w1": 2.0}}, ["w1", "w2"])
    p.rho["b"]           # rho at p.taus: b is never within tau on w2 (it did not run it)
    p.score("a")         # (4 - 1)/3 and (4 - 3)/3 averaged over the 2 workloads = 2/3
    p.geomean("b")       # 2.0: over the workloads b ran (p.ran("b") == 1)

- rho(tau) of an entry is the share of the N counted workloads on which its ranked figure is
  within tau times the best entry's ("times the best" >= 1 whichever the metric's direction);
  a workload it did not run, or ran without a ranked figure, never counts as within tau
  (AlgoPerf counts a missed workload as infinitely slow);
- its score is the integral of rho over [1, TAU_MAX] divided by TAU_MAX - 1: 1 when it is the
  best everywhere, 0 when it is never within TAU_MAX times the best. rho is a step function
  (right-continuous, it jumps at each ratio); the taus of a profile include every ratio, so the
  left Riemann sum over them is the exact integral;
- the geometric mean of "times the best" is over the workloads the entry ran only: read it with
  the count beside it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

TAU_MAX = 4.0


def taus(points: int = 301, breakpoints: Iterable[float] = ()) -> list[float]:
    """An even grid over [1, TAU_MAX] of `points` points, plus every breakpoint inside it (the
    ratios where a profile jumps), sorted."""
    grid = {1.0 + (TAU_MAX - 1.0) * i / (points - 1) for i in range(points)}
    grid |= {float(b) for b in breakpoints if 1.0 <= b <= TAU_MAX}
    return sorted(grid)


def rho(ratios: Mapping[str, float], workloads: Sequence[str], taus: Sequence[float]
        ) -> list[float]:
    """rho at each tau: the share of `workloads` on which ratios[w] <= tau (absent: never)."""
    if not workloads:
        return [0.0] * len(taus)
    values = [ratios[w] for w in workloads if ratios.get(w) is not None]
    return [sum(r <= tau for r in values) / len(workloads) for tau in taus]


def profile_score(rho: Sequence[float], taus: Sequence[float]) -> float:
    """The integral of the step profile over [taus[0], taus[-1]] (rho[i] holds on
    [taus[i], taus[i+1])), divided by the interval's length: exact when every jump of rho is one
    of the taus."""
    area = sum((taus[i + 1] - taus[i]) * rho[i] for i in range(len(taus) - 1))
    return area / (taus[-1] - taus[0])


def geometric_mean(values: Iterable[float]) -> float | None:
    """exp(mean(log v)) of positive values (inf when one is infinite); None when there are none."""
    vals = [float(v) for v in values]
    if not vals:
        return None
    if any(math.isinf(v) for v in vals):
        return math.inf
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


@dataclass
class Profile:
    """The profile of several entries over the same N workloads."""

    workloads: list[str]  # the N workloads counted
    ratios: dict[str, dict[str, float]]  # entry -> workload -> times the best (those it ran)
    taus: list[float]
    rho: dict[str, list[float]]

    def score(self, entry: str) -> float:
        return profile_score(self.rho[entry], self.taus)

    def ran(self, entry: str) -> int:
        """On how many of the counted workloads the entry has a ranked figure."""
        return sum(1 for w in self.workloads if w in self.ratios[entry])

    def best_on(self, entry: str) -> int:
        """On how many workloads the entry is the best (times the best = 1)."""
        return sum(1 for w in self.workloads if self.ratios[entry].get(w) == 1.0)

    def geomean(self, entry: str) -> float | None:
        """The geometric mean of times the best over the workloads the entry ran."""
        return geometric_mean(self.ratios[entry][w] for w in self.workloads
                              if w in self.ratios[entry])


def build(ratios: Mapping[str, Mapping[str, float | None]], workloads: Sequence[str],
          points: int = 301) -> Profile:
    """The profile of entries given their times-the-best per workload (None or absent: no
    ranked figure there) over the N `workloads`."""
    kept = {name: {w: float(r) for w, r in per.items() if r is not None and w in workloads}
            for name, per in ratios.items()}
    grid = taus(points, (r for per in kept.values() for r in per.values()))
    return Profile(list(workloads), kept, grid,
                   {name: rho(per, workloads, grid) for name, per in kept.items()})


def from_scores(scores: Mapping[str, Mapping[str, float]], points: int = 301) -> Profile:
    """The profile of lower-is-better scores (`scores[entry][workload]`, inf = missed): times the
    best per workload; workloads no entry met (best infinite, or not positive) are left out."""
    names = sorted({w for s in scores.values() for w in s})
    best = {w: min(s.get(w, math.inf) for s in scores.values()) for w in names}
    counted = [w for w in names if math.isfinite(best[w]) and best[w] > 0]
    return build({name: {w: s[w] / best[w] for w in counted if w in s}
                  for name, s in scores.items()}, counted, points)


def performance_profile(scores: Mapping[str, Mapping[str, float]], taus: Sequence[float]
                        ) -> dict[str, list[float]]:
    """rho(tau) at the given taus per entry of lower-is-better `scores` (see from_scores)."""
    p = from_scores(scores)
    return {name: rho(per, p.workloads, taus) for name, per in p.ratios.items()}
