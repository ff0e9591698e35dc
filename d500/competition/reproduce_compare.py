"""What a reproduction must agree on with the run it re-ran, and within what: the status, the
steps and epochs to the target, the accuracies, the evaluation series and, at level 3, the bytes
each step sends and receives; times only on the run's own hardware
(d500.competition.reproduce_time).

Why these tolerances (measured on this repository's digits workloads, torch and TensorFlow CPU):

- The same run re-run on the same machine, same backend, is bit-identical: digits-mlp seeds 0-2
  at 1 and at 2 torch threads gave the same losses to the last bit and the same figures.
- Float reassociation is what changes across machines: another CPU's vector width, another
  thread count or BLAS blocks the same sums differently, each float32 sum then differs by a few
  units in the last place (2^-24 relative) and SGD amplifies that step by step. A second kernel
  path for the same arithmetic (TensorFlow's instead of torch's) is such a reassociation:
  digits-mlp seeds 0-9, 6-10 evaluations each, gave the same status and epochs to the target in
  10 of 10 runs, train losses differing by up to 2e-2 relative, and validation and test
  accuracies differing by at most 1 sample of 300 at any evaluation (seed 9; all others equal).
- An accuracy is a count of samples over the split: a perturbation changes it only by flipping
  samples whose two largest logits are closer than the perturbation, one sample at a time. So
  accuracies are compared in samples: at most ACCURACY_SAMPLES (2: twice the largest flip
  measured above) of the split's size, i.e. 2/300 = 0.0067 on digits.
- A run meets its target at the first evaluation whose validation accuracy reaches it; one flipped
  sample at a crossing that was within a sample or two of the target moves it by one evaluation.
  Steps and epochs to the target are therefore equal, or one evaluation apart when the run that
  crossed later was within the accuracy tolerance of the target at the earlier crossing (that
  evaluation is in both series). Anything else is a disagreement.
- A chaotic workload is not covered by any tolerance: digits-lenet's trajectories at 1 and 2
  torch threads (or torch against TensorFlow) agree for 2-6 epochs and then separate completely
  (epochs to the target 11 to 18 for the same seed). Such a reproduction disagrees, and the
  report says at which evaluation the series separated and how the environments differ, so the
  organiser can tell reassociation (separation after agreeing evaluations, another CPU or thread
  count) from a doctored result (a figure its own series does not show, or a first evaluation
  that already differs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

ACCURACY_SAMPLES = 2
# figure name -> the split its accuracy is counted on
ACCURACIES = {"val_accuracy": "validation", "test_accuracy": "test",
              "final_test_accuracy": "test"}
TO_TARGET = ("epochs", "steps")
# Level 3: counted from the scheme's own messages (d500.distributed.comm), never the network, so
# set by the scheme, the model and the world size alone: equal on every machine (to rounding of
# the per-step mean), except under a timing-dependent scheme.
COMMUNICATION = ("bytes_per_step", "bytes_received_per_step", "compression_ratio")


@dataclass
class Check:
    """One compared figure of one run: both values, the tolerance in words, the verdict."""

    name: str
    recorded: Any
    reproduced: Any
    tolerance: str
    agrees: bool
    note: str = ""
    inconclusive: bool = False  # not judged: a time budget cut one run short (see compare)

    def line(self) -> str:
        """`name: recorded R, reproduced P (tolerance T)`, for a disagreement's report line."""
        text = (f"{self.name}: recorded {show(self.recorded)}, reproduced "
                f"{show(self.reproduced)} (tolerance: {self.tolerance})")
        return text + (f"; {self.note}" if self.note else "")


@dataclass
class Series:
    """A run's evaluations as (step, epoch, val_accuracy, test_accuracy), in order."""

    points: list[tuple[int, float, float | None, float | None]] = field(default_factory=list)

    @classmethod
    def of(cls, evaluations: Sequence[Any]) -> Series:
        """From ledger evaluation dicts ({step, epoch, metrics}) or packaged rows
        [step, epoch, wall_time, metrics, recorded] (metrics a dict or its JSON text)."""
        import json
        points = []
        for e in evaluations:
            if isinstance(e, dict):
                step, epoch, metrics = e.get("step"), e.get("epoch"), e.get("metrics") or {}
            else:
                step, epoch, metrics = e[0], e[1], e[3]
            if isinstance(metrics, str):
                metrics = json.loads(metrics)
            points.append((int(step or 0), float(epoch or 0.0), metrics.get("val_accuracy"),
                           metrics.get("test_accuracy")))
        return cls(points)

    def at(self, step: int) -> tuple[int, float, float | None, float | None] | None:
        return next((p for p in self.points if p[0] == step), None)


def show(value: Any) -> str:
    if isinstance(value, float):
        if math.isinf(value):
            return "inf"
        if value.is_integer():
            return f"{value:g}"
        return f"{value:.3g}" if abs(value) < 1e-3 else f"{value:.4f}"
    return "-" if value is None else str(value)


def samples(split_size: int) -> float:
    """The accuracy tolerance on a split of this size (ACCURACY_SAMPLES samples)."""
    return ACCURACY_SAMPLES / split_size


def _close(a: float | None, b: float | None, tol: float) -> bool:
    if a is None or b is None:
        return a is b
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= tol + 1e-12  # accuracies are k/N in binary: allow their rounding


def compare(recorded: dict[str, Any], reproduced: dict[str, Any], status: tuple[str, str],
            series: tuple[Series, Series], sizes: dict[str, int], target: float,
            errors: tuple[str | None, str | None] = (None, None),
            exact: tuple[str, ...] = ()) -> list[Check]:
    """Every check of one run: `recorded`/`reproduced` its figures, `status` (recorded,
    reproduced), `series` the evaluations of each, `sizes` the split sizes ("validation",
    "test"), `target` the validation target, `errors` the runs' error lines (shown beside the
    status when they differ; a message may name this machine's paths, so it is not judged),
    `exact` figures that must be equal (to 1e-9 relative) when both runs have them."""
    rec_series, rep_series = series
    checks = [Check("status", status[0], status[1], "equal", status[0] == status[1],
                    error_note(errors))]
    shift = _crossing_shift(recorded, reproduced, rec_series, rep_series, sizes, target)
    for name in TO_TARGET:
        if name not in recorded and name not in reproduced:
            continue
        a, b = recorded.get(name), reproduced.get(name)
        explained = shift is not None and a != b
        checks.append(Check(name, a, b, "equal, or one evaluation apart at a crossing within "
                            "the accuracy tolerance of the target", a == b or explained,
                            shift if explained else ""))
    # one evaluation apart: the accuracies at the target are compared at the recorded step
    at = rep_series.at(int(recorded["steps"])) if shift is not None else None
    for name, split in ACCURACIES.items():
        if name not in recorded and name not in reproduced:
            continue
        tol = samples(sizes[split])
        a, b = recorded.get(name), reproduced.get(name)
        note = ""
        if at is not None:
            b = at[2] if split == "validation" else at[3]
            note = f"the reproduction's evaluation at the recorded step {at[0]}"
        checks.append(Check(name, a, b, f"±{ACCURACY_SAMPLES} of {sizes[split]} {split} "
                            f"samples ({tol:.4f})", _close(a, b, tol), note))
    for name in exact:
        a, b = recorded.get(name), reproduced.get(name)
        if a is None or b is None:
            continue
        checks.append(Check(name, a, b, "equal (1e-9 relative)",
                            a == b or (math.isfinite(a) and math.isfinite(b)
                                       and abs(a - b) <= 1e-9 * max(abs(a), abs(b)))))
    checks.append(_series_check(rec_series, rep_series, sizes))
    budget = _time_budget(recorded, reproduced, status, series, checks[-1])
    if budget:
        checks[0].note = budget
        for check in checks[:-1]:
            check.inconclusive = not check.agrees
    return checks


def _time_budget(recorded: dict[str, Any], reproduced: dict[str, Any], status: tuple[str, str],
                 series: tuple[Series, Series], evaluations: Check) -> str:
    """Why one run succeeded and the other missed when a time budget explains it: the one that
    missed stopped before the step where the other met the target (so not at the epoch budget:
    at max_seconds, on a slower or busier machine) and the evaluations agree up to there."""
    if set(status) != {"succeeded", "missed"} or not evaluations.agrees:
        return ""
    won = 0 if status[0] == "succeeded" else 1
    steps = (recorded, reproduced)[won].get("steps")
    lost = series[1 - won].points
    if steps is None or math.isinf(steps) or not lost or lost[-1][0] >= steps:
        return ""
    who = ("the reproduction", "the recorded run")[won]
    return (f"{who} spent its time budget (max_seconds) at step {lost[-1][0]}, before the "
            f"target step {int(steps)} of the other, with the evaluations in agreement: a "
            "difference of machine speed, not of the result (inconclusive)")


def error_note(errors: tuple[str | None, str | None]) -> str:
    """The two runs' error lines when they differ (shown, not judged), else ""."""
    a, b = errors
    if a == b or not (a or b):
        return ""
    return f"errors: recorded {a or '-'!r}, reproduced {b or '-'!r}"


def _crossing_shift(recorded: dict[str, Any], reproduced: dict[str, Any], rec: Series,
                    rep: Series, sizes: dict[str, int], target: float) -> str | None:
    """Why the target was met one evaluation apart, when reassociation explains it: the run
    that met it later was within the tolerance of the target at the earlier one's crossing,
    and that crossing is the evaluation just before its own. None otherwise."""
    a, b = recorded.get("steps"), reproduced.get("steps")
    if a is None or b is None or a == b or math.isinf(a) or math.isinf(b):
        return None
    late, late_series = (rep, rep) if a < b else (rec, rec)
    first, second = min(a, b), max(a, b)
    steps = [p[0] for p in late_series.points]
    if int(second) not in steps or int(first) not in steps:
        return None
    if steps.index(int(second)) - steps.index(int(first)) != 1:
        return None
    point = late_series.at(int(first))
    tol = samples(sizes["validation"])
    if point is None or point[2] is None or point[2] < target - tol - 1e-12:
        return None
    who = "the reproduction" if late is rep else "the recorded run"
    return (f"{who} had validation accuracy {point[2]:.4f} at step {int(first)}, within "
            f"{ACCURACY_SAMPLES} samples of the target {target}")


def _series_check(rec: Series, rep: Series, sizes: dict[str, int]) -> Check:
    """The evaluations both runs made (same steps): validation and test accuracy within the
    tolerance at each; the note says where the series first differ at all."""
    common = [(p, rep.at(p[0])) for p in rec.points if rep.at(p[0]) is not None]
    worst, same, first_diff, bad = 0, None, None, None
    for p, q in common:
        offs = {split: round(abs(p[i] - q[i]) * sizes[split])
                for i, split in ((2, "validation"), (3, "test"))
                if p[i] is not None and q[i] is not None}
        worst = max([worst, *offs.values()])
        if first_diff is None and any(offs.values()):
            first_diff = p
        elif first_diff is None:
            same = p
        if bad is None and any(v > ACCURACY_SAMPLES for v in offs.values()):
            split = max(offs, key=offs.__getitem__)
            bad = (p, split, offs[split])
    n = len(common)
    recorded = f"{len(rec.points)} evaluations"
    reproduced = f"{len(rep.points)} evaluations"
    if n == 0 and not rec.points and not rep.points:
        note = "neither run evaluated"
    elif first_diff is None:
        note = f"identical at all {n} common evaluations"
    elif same is None:
        note = (f"different from the first evaluation (epoch {show(first_diff[1])}, step "
                f"{first_diff[0]}) on, by up to {worst} sample(s)")
    else:
        note = (f"identical through epoch {show(same[1])} (step {same[0]}), then up to {worst} "
                f"sample(s) apart")
    if bad is not None:
        note = (f"{bad[2]} {bad[1]} samples apart at epoch {show(bad[0][1])} (step {bad[0][0]}); "
                + note)
    if n == 0 and (rec.points or rep.points):
        return Check("evaluations", recorded, reproduced, "evaluations at the same steps",
                     False, "no evaluation at a common step")
    return Check("evaluations", recorded, reproduced, f"each common evaluation's accuracies "
                 f"±{ACCURACY_SAMPLES} samples", bad is None, note)
