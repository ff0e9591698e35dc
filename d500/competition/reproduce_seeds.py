"""A reproduction at seeds the organiser draws now (`d500 reproduce --fresh-seeds N`): the
package's entry re-run at N seeds nobody knew before, its recorded required-seed runs tested
against them.

The required seeds derive from the workload, the entry's name and the backend
(d500.training.seeds.required), and the name is the sender's: a sender who trains K names'
required seeds and submits the fastest name (or whose code knows its required seeds and does
better at them) has recorded runs better than the entry's runs at other seeds. Under the null
hypothesis (honest seeds) the recorded required-seed runs and the fresh ones are draws of one
distribution, exchangeable, so the reference-convergence test applies unchanged with the fresh
runs as the reference (d500.competition.convergence.check_epochs: a one-sided permutation test
of the mean, exact up to its RESAMPLES). It flags the recorded runs when their mean epochs to
target is lower than the fresh runs' beyond chance at ALPHA = 0.05: an honest package is
flagged in at most 5% of draws. A run that ended without meeting the target (missed, diverged)
counts as max_epochs + 1 on both sides (the same transform on both keeps the null exact; it is
slower than any success); a run that failed or timed out says nothing about its seed and is
left out, named. With M recorded runs and N fresh, the smallest p-value is 1 / C(M + N, M):
at M = 3, N must be at least 4 for a flag to be possible (1/35), at M = 2 at least 5 (1/21).

The test has little power against a name picked among K for its seeds (one epoch of gain is
inside the seeds' spread: README), so the fresh runs also score: the boards of the ledger they
are recorded in rank the result on them, not on its recorded seeds (d500.training.seeds.drawn).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from d500.competition import convergence
from d500.competition.reproduce_compare import Check
from d500.training.tuning import seed_of

COUNTED = ("succeeded", "missed", "diverged")  # ended runs whose epochs say something


def draw(draw_seed: int, workload: str, backend: str, n: int) -> list[int]:
    """The n fresh seeds of a result under the draw seed (repeatable from it, never the
    sender's: the draw seed is drawn when the organiser reproduces)."""
    return [seed_of("fresh", draw_seed, workload, backend, i) for i in range(n)]


def results(runs: Sequence[Any]) -> list[tuple[Any, list[Any]]]:
    """[(a template run, the recorded required-seed runs)] per result (workload, backend, world
    size) of a package's level-2/3 seed runs (trials and explorations left out)."""
    from d500.training.seeds import sort_out
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for run in runs:
        if run.level in (2, 3) and run.trial is None and run.seed is not None \
                and run.rank in (None, 0):
            groups.setdefault((run.workload, run.backend, run.world_size), []).append(run)
    out = []
    for key in sorted(groups, key=str):
        by_row = {id(r.row): r for r in groups[key]}
        found = sort_out([r.row for r in groups[key]])
        required = [by_row[id(row)] for row in found.scored + found.unscored]
        if required:
            out.append((min(required, key=lambda r: r.origin_id), required))
    return out


def value(status: str | None, figures: dict[str, Any], max_epochs: int) -> float | None:
    """A run's epochs to target for the test: its epochs when it met the target,
    max_epochs + 1 when it ended without (None: it failed or timed out, not counted)."""
    if status not in COUNTED:
        return None
    epochs = figures.get("epochs")
    if status == "succeeded" and isinstance(epochs, (int, float)) and math.isfinite(epochs):
        return float(epochs)
    return float(max_epochs + 1)


def verdict(workload: str, entry: str, backend: str, recorded: Sequence[float],
            fresh: Sequence[float], draw_seed: int) -> Check:
    """The recorded required-seed runs' epochs against the fresh seeds' (the permutation test
    of d500.competition.convergence with the fresh runs as the reference)."""
    name = f"{workload}: mean epochs to target at the required seeds against fresh seeds"
    if not recorded or len(fresh) < 2:
        return Check(name, None, None, "recorded runs and at least 2 fresh ones", True,
                     note=f"{len(recorded)} recorded and {len(fresh)} fresh run(s) counted: "
                          "not judged", inconclusive=True)
    reference = convergence.Reference(
        "epochs", f"{entry} at {len(fresh)} fresh seeds", backend,
        f"d500 reproduce --fresh-seeds {len(fresh)} --seed {draw_seed}",
        tuple(float(v) for v in fresh), None)
    tested = convergence.check_epochs(reference, list(recorded))
    floor = 1 / math.comb(len(recorded) + len(fresh), len(recorded))
    before = round(sum(recorded) / len(recorded), 3)
    after = round(sum(fresh) / len(fresh), 3)
    tolerance = (f"p >= {convergence.ALPHA:g} that {len(recorded)} of the {len(recorded)} + "
                 f"{len(fresh)} runs pooled have a mean as low (one-sided permutation test)")
    if floor >= convergence.ALPHA:
        return Check(name, before, after, tolerance, True, inconclusive=True,
                     note=f"p = {tested.p_value:.3g}; with {len(fresh)} fresh run(s) against "
                          f"{len(recorded)} the smallest p is {floor:.3g}: not judged (draw "
                          "more fresh seeds)")
    return Check(name, before, after, tolerance, not tested.flagged,
                 note=f"p = {tested.p_value:.3g} for {after - before:+.3g} epochs "
                      f"({len(recorded)} recorded, {len(fresh)} fresh)"
                      + ("; the recorded seeds are faster than chance explains"
                         if tested.flagged else ""))
