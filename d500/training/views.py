"""Level 2's sections of the leaderboard: the tuning score and cost of every entry, statistics
over the required seeds (explorations: noted, never scored), validation accuracy against wall
time for every trial, and the performance profile over the level's workloads (the same
submission on torch and TensorFlow side by side).

When the boards hold runs of several machines (and the organiser did not pass --across-machines),
every time-based section is computed and shown per machine, headed by its hardware, and one
section pools what any machine may be compared on: test accuracy and epochs to the target."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from d500 import metrics, profile
from d500.leaderboard.environments import apart, hardware_text
from d500.levels import View
from d500.training import score

APART = ("rows of this machine only: times measured on different hardware are never compared "
         "(d500 leaderboard --across-machines pools every machine's runs)")

POOLED = ("medians over every machine's runs of the entry; a seed run that missed the target "
          "counts as ∞ epochs; which trial of a study is the fastest is decided by time, on the "
          "machine that ran the study")


TEST = ("test: accuracy on the test split, or a language model's test log-perplexity (nats, "
        "lower is better)")


def views(level: int, boards: Sequence[Any], ledger: Any) -> list[View]:
    """The summary views over the runs of these boards (each board one workload's rules)."""
    from d500.leaderboard import modes
    best = modes.view(boards)  # each framework at its best mode (torch or torch:compiled)
    return _views(level, boards, ledger) + ([best] if best else [])


def _views(level: int, boards: Sequence[Any], ledger: Any) -> list[View]:
    wanted = {(b.workload, b.workload_sha256) for b in boards}
    runs = [r for r in ledger.runs(level=level) if (r["workload"], r["workload_sha256"]) in wanted]
    if not runs:
        return []
    machines = apart(boards)
    from d500.competition import same_code
    copies = same_code.copies(ledger) if hasattr(ledger, "packages") else {}
    if not machines:
        entries = score.entries(runs, copies)
        out = [tuning_view(entries), seeds_view(entries), profile_view(entries)]
        out += [curves_view(w, [[e for e in entries if e.workload == w]], ledger)
                for w in sorted({e.workload for e in entries})]
        return [v for v in out if v is not None and (v.rows or v.plots)]
    envs = ledger.environments()
    groups = score.by_machine(runs, envs, machines)
    words = {key: machines.get(key) or hardware_text(envs.get(group[0]["environment"]))
             for key, group in groups.items()}
    out = []
    per_machine = {key: score.entries(group, copies) for key, group in groups.items()}
    for key, entries in per_machine.items():
        out += [tuning_view(entries, words[key]), seeds_view(entries, words[key]),
                profile_view(entries, words[key])]
    pooled = score.entries(runs, copies)
    out.append(accuracy_view(pooled))
    out += [curves_view(w, [[e for e in entries if e.workload == w]
                            for entries in per_machine.values()], ledger, list(words.values()))
            for w in sorted({e.workload for e in pooled})]
    return [v for v in out if v is not None and (v.rows or v.plots)]


def _fmt(name: str, value: float | None) -> str:
    return metrics.get(name).format(value)


def _on(on: str | None) -> str:
    return f" on {on}" if on else ""


def tuning_view(entries: list[score.Entry], on: str | None = None) -> View:
    """Every tuned entry's score, tuning cost and trial counts; `on` (the hardware of one
    machine, when runs of several are kept apart) leaves test accuracy to accuracy_view."""
    rows = []
    for e in sorted((e for e in entries if e.studies),
                    key=lambda e: (e.workload, e.score if e.score is not None else math.inf)):
        c = e.counts()
        counts = " / ".join(str(c.get(s, 0)) for s in ("succeeded", "missed", "diverged",
                                                         "failed", "interrupted"))
        test = [] if on else [_test(e.trials, e.test_quality())]
        rows.append([e.workload, e.submission, e.backend, _fmt("time_to_accuracy", e.score),
                     _fmt("time_to_accuracy", e.tuning_cost), *test, str(len(e.studies)),
                     counts])
    what = ("the tuning-inclusive cost (wall time of every trial)" if on else
            "the tuning-inclusive cost (wall time of every trial) and test quality at target")
    return View(f"tuning{_on(on)}: score (median over studies of the fastest trial to the "
                f"target), {what}",
                ["workload", "submission", "backend", "score", "tuning cost",
                 *([] if on else ["test"]), "studies",
                 "trials ok / missed / diverged / failed / interrupted"], rows,
                notes=[APART] if on else [TEST])


def seeds_view(entries: list[score.Entry], on: str | None = None) -> View:
    """Time to accuracy over each entry's scored seed runs (the M > N window where the workload
    allows more runs than score; d500.training.window), scaled by MLPerf's RCP normalization
    (d500.competition.convergence.rcp_scale), and, unless `on` one machine, their median test
    accuracy."""
    rows, notes = [], []
    for e in entries:
        if not e.seeds:
            continue
        scale = e.rcp()
        tta = score.over_seeds([score.time_to_target(r) * scale.factor for r in e.seeds])
        ci = tta.ci95
        test = [] if on else [_test(e.seeds, _median_test(e.seeds))]
        again = sum(1 for r in e.seeds if r.get("details", {}).get("resumed"))
        run = len(e.seeds) + len(e.unscored)
        rows.append([e.workload, e.submission, e.backend,
                     str(tta.n) + (f" of {run}" if e.unscored else "")
                     + (f" ({again} resumed)" if again else ""),
                     _fmt("time_to_accuracy", tta.median),
                     _fmt("time_to_accuracy", tta.olympic_mean),
                     "—" if ci is None else f"{_fmt('time_to_accuracy', ci[0])} – "
                                            f"{_fmt('time_to_accuracy', ci[1])}",
                     f"{scale.factor:.3g}", *test])
        name = f"{e.workload} / {e.submission} / {e.backend}"
        if e.choice is not None:
            notes.append(f"scored: {name}: run(s) {', '.join(str(r.get('id')) for r in e.seeds)}"
                         f" of {run}: {e.choice.reason}; not scored: run(s) "
                         f"{', '.join(str(r.get('id')) for r in e.unscored)}")
        if scale.factor != 1.0 or scale.result_mean is not None:
            notes.append(f"RCP scale: {name}: {scale.reason}")
        if e.drawn:
            draws = sorted({str((r.get("details") or {}).get("reproduction", {}).get(
                "draw_seed")) for r in e.seeds})
            notes.append(f"{'not scored' if e.seeds_note else 'scored'}: {name}: the "
                         f"organiser's seed(s) {', '.join(str(r.get('seed')) for r in e.seeds)}"
                         f" (run(s) {', '.join(str(r.get('id')) for r in e.seeds)}, d500 "
                         f"reproduce --fresh-seeds, draw seed {', '.join(draws)})"
                         + (f": {e.seeds_note}" if e.seeds_note else ""))
        elif e.seeds_note:
            notes.append(f"not scored: {name}: {e.seeds_note}")
    tail = "" if on else " and median test quality"
    return View(f"seeds{_on(on)}: time to accuracy over the scored seeds (median, MLPerf olympic "
                f"mean, bootstrap 95% interval of the median; a miss counts as ∞; times "
                f"multiplied by the RCP scale){tail}",
                ["workload", "submission", "backend", "seeds", "median", "olympic mean",
                 "95% interval", "RCP scale", *([] if on else ["test"])], rows,
                notes=([APART] if on else [TEST]) + notes + explorations_notes(entries)
                + resumed_notes(entries))


def resumed_notes(entries: list[score.Entry]) -> list[str]:
    """One note per resumed seed run (d500.training.resume): its segments, all on its clock."""
    out = []
    for e in entries:
        for r in e.seeds:
            info = r.get("details", {}).get("resumed")
            if info:
                out.append(f"resumed: {e.workload} / {e.submission} / {e.backend}: run "
                           f"{r.get('id')} continued run {info['from_run']} from its epoch "
                           f"{info['epoch']} checkpoint; its time counts all "
                           f"{len(info.get('segments', [])) + 1} segments")
    return out


def explorations_notes(entries: list[score.Entry]) -> list[str]:
    """One note per entry with exploration runs (seeds the rules did not choose): not scored."""
    out = []
    for e in (e for e in entries if e.explorations):
        shown = ", ".join(str(r.get("seed")) for r in e.explorations[:8])
        more = ", …" if len(e.explorations) > 8 else ""
        out.append(f"not scored: {e.workload} / {e.submission} / {e.backend}: "
                   f"{len(e.explorations)} exploration run(s), seed(s) {shown}{more}: seeds the "
                   f"rules did not choose")
    return out


def _median_test(runs: list[dict[str, Any]]) -> float | None:
    return score.over_seeds([r["figures"].get(score.test_name(r), math.nan)
                             for r in runs]).median


def _test(runs: list[dict[str, Any]], value: float | None) -> str:
    """A test-quality cell, formatted by the runs' own figure (accuracy, or nats)."""
    return _fmt(score.test_name(runs[0]) if runs else "test_accuracy", value)


def accuracy_view(entries: list[score.Entry]) -> View:
    """What compares across machines, pooled over every machine's runs: test accuracy over the
    seeds and at the target of each study's fastest trial, and epochs to the target."""
    rows = []
    for e in entries:
        if not e.seeds and not e.studies:
            continue
        epochs = score.over_seeds([score.to_target(r, "epochs") for r in e.seeds])
        rows.append([e.workload, e.submission, e.backend, str(len(e.seeds)),
                     _test(e.seeds, _median_test(e.seeds)), _fmt("epochs", epochs.median),
                     str(len(e.studies)), _test(e.trials, e.test_quality())])
    return View("accuracy over every machine: test quality and epochs to the target over seeds, "
                "test quality at target of each study's fastest trial (comparable on any "
                "machine: pooled)",
                ["workload", "submission", "backend", "seeds", "test", "epochs to target",
                 "studies", "test at target"], rows,
                notes=[POOLED, TEST])


def profile_view(entries: list[score.Entry], on: str | None = None) -> View | None:
    """AlgoPerf's performance profile over workloads, from each entry's tuning score (or, with
    no study, its median time over seeds); `on`: the hardware of the one machine they ran on.
    Below two workloads the profile is a single jump per entry: a table of each entry's time
    and × best instead of the plot."""
    scores: dict[str, dict[str, float]] = {}
    for e in entries:
        if e.reproduction or e.copy_of:  # a re-check, or a copy of another entry's code
            continue
        if not e.studies and (e.seeds_note or e.drawn and any(  # its tuning score counts
                o.studies and (o.workload, o.name, o.backend) == (e.workload, e.name, e.backend)
                for o in entries)):
            continue  # seeds that do not score it (d500.training.score._seeds_notes)
        value = e.score if e.studies else score.over_seeds(
            [score.time_to_target(r) for r in e.seeds]).median
        if value is not None:
            scores.setdefault(f"{e.submission} / {e.backend}", {})[e.workload] = value
    if not scores:
        return None
    p = profile.from_scores(scores)
    workloads = sorted({w for s in scores.values() for w in s})
    title = (f"performance profile over {len(workloads)} workload(s){_on(on)}: ρ(τ) and its "
             f"integral up to τ = {profile.TAU_MAX:g} (1 = fastest everywhere)")
    notes = [APART] if on else []
    if len(workloads) < 2:
        [workload] = workloads
        times = {name: s[workload] for name, s in scores.items()}
        best = min(times.values())
        rows = [[name, _fmt("time_to_accuracy", t), _ratio(t, best), f"{p.score(name):.3f}"]
                for name, t in sorted(times.items(), key=lambda kv: (kv[1], kv[0]))]
        return View(f"performance profile over 1 workload(s){_on(on)}: one workload, so a "
                    "table, not the ρ(τ) plot (over one workload it is one jump per entry)",
                    ["submission / backend", f"{workload}: time to the target", "× best",
                     "profile score"], rows,
                    notes=notes + ["× best: the entry's time over the fastest entry's; the "
                                   "profile plot appears once the level has two or more "
                                   "workloads"])
    from d500.leaderboard.plots import figure, png
    fig = figure(7, 3.2)
    ax = fig.add_subplot()
    for i, name in enumerate(sorted(p.rho)):
        ax.step(p.taus, p.rho[name], where="post", label=name, color=f"C{i % 10}")
    ax.set_xlabel("τ (times the best entry's time to the target)")
    ax.set_ylabel("share of workloads ρ(τ)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    fig.tight_layout()
    rows = sorted(([name, f"{p.score(name):.3f}", str(len(scores[name]))] for name in p.rho),
                  key=lambda row: -float(row[1]))
    return View(title, ["submission / backend", "profile score", "workloads"], rows,
                plots=[("performance profile ρ(τ)", png(fig))], notes=notes)


def _ratio(value: float, best: float) -> str:
    if math.isinf(value):
        return "∞" if math.isfinite(best) else "—"
    return f"{value / best:.2f}×" if best > 0 else "—"


def curves_view(workload: str, groups: list[list[score.Entry]], ledger: Any,
                machines: list[str] | None = None) -> View | None:
    """Validation accuracy against wall time for every trial and seed run of a workload: one
    plot per group of entries (per machine, named in `machines`, when they are kept apart)."""
    plots = []
    for i, entries in enumerate(groups):
        on = _on(machines[i]) if machines else ""
        data = _curves(entries, ledger)
        if data is not None:
            plots.append((f"{workload}: tuning curves{on}", data))
    if not plots:
        return None
    apart_note = "; one plot per machine (wall times of different hardware)" if machines else ""
    return View(f"{workload}: validation accuracy against wall time (log scale), every trial "
                f"and seed run (dotted: missed, diverged or failed), each entry's median over "
                f"its runs in front{apart_note}", plots=plots)


def _curves(entries: list[score.Entry], ledger: Any) -> bytes | None:
    """Every run's validation accuracy (thin, behind; dotted when it missed, diverged or failed)
    and, drawn in front, each entry's median curve over its runs, on a log wall-time axis (one
    slow trial no longer squeezes the rest against zero), the legend outside the axes, below."""
    from matplotlib import patheffects

    from d500.leaderboard.plots import figure, png
    fig = figure(7, 4.2)
    ax = fig.add_subplot()
    drawn = 0
    medians = []
    for i, e in enumerate(entries):
        color = f"C{i % 10}"
        curves = []
        for r in [*e.trials, *e.seeds]:
            points = [(ev["wall_time"], ev["metrics"]["val_accuracy"])
                      for ev in ledger.evaluations(r["id"])
                      if "val_accuracy" in ev["metrics"] and ev["wall_time"] is not None
                      and ev["wall_time"] > 0]  # a log axis: the start (t = 0) is off it
            if not points:
                continue
            style = "-" if r["status"] == "succeeded" else ":"
            ax.plot(*zip(*points), style, color=color, alpha=0.35, lw=0.8, marker=".",
                    markersize=2, zorder=2)
            curves.append(sorted(points))
            drawn += 1
        if curves:
            medians.append((f"{e.submission} / {e.backend}", color, curves))
    if not drawn:
        return None
    outline = [patheffects.Stroke(linewidth=4, foreground="white"), patheffects.Normal()]
    for label, color, curves in medians:
        xs, ys = median_curve(curves)
        ax.step(xs, ys, where="post", color=color, lw=2.2, zorder=5, path_effects=outline,
                label=f"{label}: median of {len(curves)} run{'s' * (len(curves) != 1)}")
    target = _target(entries)
    if target is not None:
        ax.axhline(target, color="black", lw=0.8, ls="--", label="target", zorder=4)
    ax.set_xscale("log")
    ax.set_xlabel("wall time since run start (s, log scale)")
    ax.set_ylabel("validation accuracy")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2,
              frameon=False)
    fig.tight_layout()
    return png(fig)


def median_curve(curves: list[list[tuple[float, float]]]) -> tuple[list[float], list[float]]:
    """The median over runs of validation accuracy at each time any run was evaluated: a run
    counts from its first evaluation on, holding its latest value (after its last one too: a run
    that stopped at the target keeps it)."""
    times = sorted({t for points in curves for t, _ in points})
    xs, ys = [], []
    for t in times:
        held = [max((p for p in points if p[0] <= t), key=lambda p: p[0])[1]
                for points in curves if points[0][0] <= t]
        xs.append(t)
        ys.append(float(statistics.median(held)))
    return xs, ys


def _target(entries: list[score.Entry]) -> float | None:
    """The validation target the runs recorded (their details, written by the trainer)."""
    for e in entries:
        for r in [*e.trials, *e.seeds]:
            target = r["details"].get("target")
            if isinstance(target, (int, float)):
                return float(target)
    return None
