"""Level 2's sections of the leaderboard: the tuning score and cost of every entry, statistics
over seeds, validation accuracy against wall time for every trial, and the performance profile
over the level's workloads (the same submission on torch and TensorFlow side by side)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from d500 import metrics, profile
from d500.levels import View
from d500.training import score


def views(level: int, boards: Sequence[Any], ledger: Any) -> list[View]:
    """The summary views over the runs of these boards (each board one workload's rules)."""
    wanted = {(b.workload, b.workload_sha256) for b in boards}
    runs = [r for r in ledger.runs(level=level) if (r["workload"], r["workload_sha256"]) in wanted]
    if not runs:
        return []
    entries = score.entries(runs)
    out = [tuning_view(entries), seeds_view(entries)]
    profile = profile_view(entries)
    if profile is not None:
        out.append(profile)
    out += [v for v in (curves_view(workload, [e for e in entries if e.workload == workload],
                                    ledger) for workload in sorted({e.workload for e in entries}))
            if v is not None]
    return [v for v in out if v.rows or v.plots]


def _fmt(name: str, value: float | None) -> str:
    return metrics.get(name).format(value)


def tuning_view(entries: list[score.Entry]) -> View:
    rows = []
    for e in sorted((e for e in entries if e.studies),
                    key=lambda e: (e.workload, e.score if e.score is not None else math.inf)):
        c = e.counts()
        counts = " / ".join(str(c.get(s, 0)) for s in ("succeeded", "missed", "diverged",
                                                         "failed", "interrupted"))
        rows.append([e.workload, e.submission, e.backend, _fmt("time_to_accuracy", e.score),
                     _fmt("time_to_accuracy", e.tuning_cost),
                     _fmt("test_accuracy", e.test_accuracy()), str(len(e.studies)), counts])
    return View("tuning: score (median over studies of the fastest trial to the target), the "
                "tuning-inclusive cost (wall time of every trial) and test accuracy at target",
                ["workload", "submission", "backend", "score", "tuning cost", "test acc",
                 "studies", "trials ok / missed / diverged / failed / interrupted"], rows)


def seeds_view(entries: list[score.Entry]) -> View:
    rows = []
    for e in entries:
        if not e.seeds:
            continue
        tta = score.over_seeds([score.time_to_target(r) for r in e.seeds])
        test = score.over_seeds([r["figures"].get("test_accuracy", math.nan) for r in e.seeds])
        ci = tta.ci95
        rows.append([e.workload, e.submission, e.backend, str(tta.n),
                     _fmt("time_to_accuracy", tta.median),
                     _fmt("time_to_accuracy", tta.olympic_mean),
                     "—" if ci is None else f"{_fmt('time_to_accuracy', ci[0])} – "
                                            f"{_fmt('time_to_accuracy', ci[1])}",
                     _fmt("test_accuracy", test.median)])
    return View("seeds: time to accuracy over seeds (median, MLPerf olympic mean, bootstrap 95% "
                "interval of the median; a miss counts as ∞) and median test accuracy",
                ["workload", "submission", "backend", "seeds", "median", "olympic mean",
                 "95% interval", "test acc"], rows)


def profile_view(entries: list[score.Entry]) -> View | None:
    """AlgoPerf's performance profile over workloads, from each entry's tuning score (or, with
    no study, its median time over seeds)."""
    scores: dict[str, dict[str, float]] = {}
    for e in entries:
        value = e.score if e.studies else score.over_seeds(
            [score.time_to_target(r) for r in e.seeds]).median
        if value is not None:
            scores.setdefault(f"{e.submission} / {e.backend}", {})[e.workload] = value
    if not scores:
        return None
    p = profile.from_scores(scores)
    from d500.leaderboard.plots import figure, png
    fig = figure(7, 3.2)
    ax = fig.add_subplot()
    for i, name in enumerate(sorted(p.rho)):
        ax.step(p.taus, p.rho[name], where="post", label=name, color=f"C{i % 10}")
    ax.set_xlabel("τ (times the best entry's time to the target)")
    ax.set_ylabel("share of workloads ρ(τ)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    rows = sorted(([name, f"{p.score(name):.3f}", str(len(scores[name]))] for name in p.rho),
                  key=lambda row: -float(row[1]))
    return View(f"performance profile over {len({w for s in scores.values() for w in s})} "
                f"workload(s): ρ(τ) and its integral up to τ = {profile.TAU_MAX:g} (1 = fastest "
                "everywhere)", ["submission / backend", "profile score", "workloads"], rows,
                plots=[("performance profile ρ(τ)", png(fig))])


def curves_view(workload: str, entries: list[score.Entry], ledger: Any) -> View | None:
    """Validation accuracy against wall time for every trial and seed run of a workload."""
    from d500.leaderboard.plots import figure, png
    fig = figure(7, 3.5)
    ax = fig.add_subplot()
    drawn = 0
    for i, e in enumerate(entries):
        color = f"C{i % 10}"
        label = f"{e.submission} / {e.backend}"
        for r in [*e.trials, *e.seeds]:
            points = [(ev["wall_time"], ev["metrics"]["val_accuracy"])
                      for ev in ledger.evaluations(r["id"])
                      if "val_accuracy" in ev["metrics"] and ev["wall_time"] is not None]
            if not points:
                continue
            style = "-" if r["status"] == "succeeded" else ":"
            ax.plot(*zip(*points), style, color=color, alpha=0.75, marker=".", markersize=3,
                    label=label)
            label = None
            drawn += 1
    if not drawn:
        return None
    target = _target(entries)
    if target is not None:
        ax.axhline(target, color="black", lw=0.8, ls="--", label="target")
    ax.set_xlabel("wall time since run start (s)")
    ax.set_ylabel("validation accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return View(f"{workload}: validation accuracy against wall time, every trial and seed run "
                "(dotted: missed, diverged or failed)", plots=[(f"{workload}: tuning curves",
                                                                png(fig))])


def _target(entries: list[score.Entry]) -> float | None:
    """The validation target the runs recorded (their details, written by the trainer)."""
    for e in entries:
        for r in [*e.trials, *e.seeds]:
            target = r["details"].get("target")
            if isinstance(target, (int, float)):
                return float(target)
    return None
