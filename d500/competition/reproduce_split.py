"""A reproduction under a split the sender never saw (`d500 reproduce --split-seed S`): the run's
epochs to target under the fresh split against what it recorded.

Entry code that rebuilds the held-out data from the public dataset (the digits ship inside d500,
and the split follows from the workload's public split seed) can train on the validation samples
from its worker, which holds the training split only. Under another split seed its rebuilt
"validation" samples are no longer the validation split, so a run that owed its speed to them
needs more epochs there. An honest run's epochs to target move too, from one split to another
as from one seed to another: the question is whether the difference is larger than two honest
runs differ. The reference runs of the workload (`reference_convergence`, d500.competition.
convergence) give that: the difference of two of them, drawn at random, exceeds D with a known
frequency (counted over every ordered pair of reference runs). Each re-run run's difference is
reported; the verdict pools the K re-run runs of a workload that met the target both times: the
mean of their K differences against the means of K differences drawn from the reference's pairs
(exact for K = 1, else RESAMPLES draws from a fixed seed). It is flagged when draws reach that
mean less often than ALPHA (one-sided: being faster under a fresh split is no sign of a cheat).
Measured on digits-mlp: an optimizer that writes the rebuilt validation split over its training
arrays met the target in 3, 3 and 3 epochs (seeds 1-3), and in 6, 6 and 7 under split seed 777
(p = 0.007 for the three; a single run's 3 or 4 epochs more is within the reference's pairs, 13%
and 7%, so draw K >= 2); sgd-momentum in 6, 10, 7 and 5, 5, 7. A run that missed its target
under the fresh split is not judged: on some splits the target is out of reach for every entry
(under split seed 12345 sgd-momentum missed it in all three seeds). The accuracies and the
evaluation series are not compared: on other validation and test samples they differ by design.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from d500.competition.reproduce_compare import Check

ALPHA = 0.05
RESAMPLES = 20_000


def exceedance(samples: Sequence[float], difference: float) -> float:
    """The share of ordered pairs (a, b) of distinct reference runs with b - a >= difference."""
    n = len(samples)
    pairs = [(a, b) for i, a in enumerate(samples) for j, b in enumerate(samples) if i != j]
    return sum(1 for a, b in pairs if b - a >= difference) / len(pairs) if n > 1 else 1.0


def check(recorded: dict[str, Any], reproduced: dict[str, Any], status: tuple[str, str],
          metric: str, split_seed: int) -> Check:
    """One re-run run's epochs to target (`metric`) under `split_seed` beside the recorded ones:
    reported, not judged (`pooled` judges); a run that did not meet its target either time is
    marked inconclusive."""
    name = f"{metric} to target under split seed {split_seed}"
    before, after = recorded.get(metric, math.inf), reproduced.get(metric, math.inf)
    if status[0] != "succeeded":
        return Check(name, before, after, "only a run that met its target is compared", True,
                     note=f"the run recorded {status[0]}", inconclusive=True)
    if status[1] != "succeeded" or not math.isfinite(after):
        return Check(name, before, after, "the target met under the fresh split", True,
                     note=f"it {status[1]} under split seed {split_seed}: not judged (the "
                          f"target may be out of reach on that split; try another seed)",
                     inconclusive=True)
    return Check(name, before, after, "reported; judged pooled over the workload's re-runs",
                 True, note=f"{after - before:+g} {metric}")


def pooled(workload: str, pairs: Sequence[tuple[float, float]], reference: Any,
           split_seed: int) -> Check:
    """The verdict on a workload's re-run runs under `split_seed`: `pairs` (recorded,
    reproduced) of those that met the target both times, against `reference` (a
    convergence.Reference; None: reported, not judged)."""
    metric = reference.metric if reference is not None else "epochs"
    name = f"{workload}: mean {metric} to target under split seed {split_seed}"
    if not pairs:
        return Check(name, None, None, "at least one run that met its target both times",
                     True, note="no run to compare", inconclusive=True)
    before = sum(a for a, _ in pairs) / len(pairs)
    after = sum(b for _, b in pairs) / len(pairs)
    if reference is None:
        return Check(name, before, after, "none: the workload has no reference_convergence",
                     True, inconclusive=True)
    p = p_value(reference.samples, after - before, len(pairs))
    return Check(name, round(before, 3), round(after, 3),
                 f"p >= {ALPHA:g} that the mean of {len(pairs)} difference(s) of two of the "
                 f"workload's {len(reference.samples)} reference runs is as large", p >= ALPHA,
                 note=f"p = {p:.3g} for {after - before:+.3g} {metric} over {len(pairs)} run(s)")


def p_value(samples: Sequence[float], mean_difference: float, k: int,
            resamples: int = RESAMPLES) -> float:
    """The share of draws of k ordered reference pairs (a, b) whose mean b - a reaches
    `mean_difference` (exact for k = 1)."""
    if mean_difference <= 0:
        return 1.0
    if k == 1:
        return exceedance(samples, mean_difference)
    differences = np.array([b - a for i, a in enumerate(samples)
                            for j, b in enumerate(samples) if i != j], dtype=np.float64)
    draws = np.random.default_rng(0).choice(differences, size=(resamples, k)).mean(axis=1)
    return float(np.mean(draws >= mean_difference - 1e-9))
