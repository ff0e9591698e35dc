"""`d500 reproduce PACKAGE [--runs K] [--seed S] [--split-seed S] [--fresh-seeds N] [--ledger PATH]
...`: re-run K
randomly chosen runs of a submission package on this machine and compare what must not depend on
it (and, on the runs' own hardware, their times), with the odds that the draw holds a forged run.
Exit 0 when every chosen run agrees, 1 when one disagrees (each named with the figure) or could
not be judged (inconclusive: its times on a machine too loaded to judge them), 2 for bad input
(not a package, K larger than its runs, a workload file that is not the rulebook's)."""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any

from d500 import paths
from d500.cli import ArgumentParser, count, seed, stdout_console
from d500.competition.reproduce_compare import show
from d500.paths import non_empty

HEADERS = ("run", "workload", "backend", "seed", "trial", "ranks", "reproduced as", "status",
           "epochs", "steps", "val acc", "test acc", "evaluations / figures", "verdict")


def main(argv: list[str], prog: str = "d500 reproduce") -> int:
    p = ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    p.add_argument("package", type=non_empty("a package file"),
                   help="a package file (d500 package ... --out FILE)")
    p.add_argument("--runs", type=count, metavar="K",
                   help="how many runs to re-run, drawn at random (default 2)")
    p.add_argument("--seed", type=seed, metavar="S",
                   help="the seed of the draw (default: an unpredictable one, printed, so the "
                        "same draw can be repeated)")
    p.add_argument("--ledger", metavar="PATH", type=non_empty("a ledger file"),
                   help="the ledger to record the reproductions in (default: $D500_HOME's)")
    p.add_argument("--rules", metavar="DIR",
                   help="the rulebook the workload files must match, laid out like levels/ "
                        "(default: d500's own)")
    paths.add_data_option(p)
    p.add_argument("--split-seed", type=seed, metavar="S",
                   help="re-run training runs under the dataset split of seed S, one the "
                        "sender never saw, and compare their epochs to target only (a run "
                        "that trained on rebuilt held-out data is slower there)")
    p.add_argument("--fresh-seeds", type=count, metavar="N",
                   help="instead of re-running recorded runs, re-run the entry at N seeds drawn "
                        "now from the draw seed (--seed repeats them) and flag recorded "
                        "required seeds that trained faster than chance explains (scouted "
                        "seeds); N >= 4 against 3 recorded seeds, >= 5 against 2")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)
    if args.fresh_seeds is not None and (args.runs is not None or args.split_seed is not None):
        p.error("--fresh-seeds re-runs no recorded run: give it without --runs and "
                "--split-seed")
    from d500.competition.package import Package
    from d500.competition.reproduce import reproduce

    pkg = Package.open(args.package)
    result = reproduce(pkg, runs=2 if args.runs is None else args.runs, seed=args.seed,
                       ledger=args.ledger,
                       rules_dir=args.rules, data_dir=args.data,
                       note=lambda text: print(text, file=sys.stderr, flush=True),
                       split_seed=args.split_seed, fresh_seeds=args.fresh_seeds)
    if args.json:
        print(json.dumps(as_json(result), indent=1, default=str))
    else:
        render(result)
    return 0 if result.agrees else 1


def _pair(check: Any) -> str:
    """`a` when both values are the same, else `a -> b`."""
    if check is None:
        return "-"
    if check.recorded == check.reproduced:
        return show(check.recorded)
    return f"{show(check.recorded)} -> {show(check.reproduced)}"


def row(report: Any) -> list[str]:
    """One run's table row: recorded -> reproduced where they differ."""
    by = {c.name: c for c in report.checks}
    acc = by.get("test_accuracy") or by.get("final_test_accuracy")
    series = by.get("evaluations")
    if series is not None:
        compared = series.note
    elif report.level == 1:
        from d500.competition.reproduce_level1 import summary
        compared = summary(report.checks)
    else:
        compared = "-"
    verdict = report.verdict if report.verdict == "agrees" else report.verdict.upper()
    seed = "-" if report.seed is None else str(report.seed)
    return [str(report.origin_id), str(report.workload), str(report.backend), seed,
            report.trial or "-", str(report.world_size or "-"),
            "-" if report.run_id is None else str(report.run_id),
            _pair(by.get("status") or by.get("validation")),
            _pair(by.get("epochs")), _pair(by.get("steps")), _pair(by.get("val_accuracy")),
            _pair(acc), compared, verdict]


def render(result: Any) -> None:
    """The draw, the table, then one line per disagreement and the environment notes."""
    from rich.table import Table
    console = stdout_console()

    def out(text: str) -> None:
        console.print(text, highlight=False, soft_wrap=True)

    how = "given" if result.seed_given else "drawn"
    if result.fresh_seeds is not None:
        return fresh(result, out, console)
    out(f"{result.package}: entry '{result.entry}', sha256 {result.sha256[:16]}…; "
        f"{len(result.runs)} of {len(result.drawn_from)} re-runnable run(s) chosen with seed "
        f"{result.seed} ({how}; `--seed {result.seed}` repeats the choice); recorded in "
        f"{result.ledger}")
    for why, ids in result.left_out.items():
        out(f"  left out: run(s) {', '.join(map(str, ids))}: {why}")
    for line in result.restarts:
        out(f"  restarts: {line}")
    if result.drawn_from:
        from d500.competition.reproduce_time import odds_line
        out(f"  {odds_line(len(result.drawn_from), len(result.runs))}")
    table = Table(title_justify="left")
    for name in HEADERS:
        table.add_column(name, overflow="fold", no_wrap=name == "verdict")
    for report in result.runs:
        table.add_row(*row(report))
    if console.is_terminal and _width(console, table) > console.width:
        for report in result.runs:  # a run a block: 14 columns at 80 were ~2 characters each
            cells = dict(zip(HEADERS, row(report), strict=True))
            out(f"run {cells.pop('run')}: {cells.pop('verdict')}")
            for name, value in cells.items():
                if value != "-":  # (what the run's level does not have)
                    out(f"  {name}: {value}")
    else:
        console.print(table)
    for report in result.runs:
        labels = [] if report.problem else [
            "inconclusive" if c.inconclusive else "disagrees" for c in report.checks
            if not c.agrees]  # each line as judged (a time on a loaded machine: inconclusive)
        for i, line in enumerate(report.disagreements()):
            out(f"{labels[i] if i < len(labels) else 'disagrees'}: {line}")
        notes = [f"threads {report.threads}"] if report.threads else []
        if report.times:
            notes.append(report.times)
        if report.timing:
            notes.append(report.timing)
        if report.environment:
            notes.append("this machine differs from the origin's: "
                         + ", ".join(report.environment))
        notes += [f"{c.name}: {c.note}" for c in report.checks
                  if c.note and c.name != "evaluations"]
        if notes:
            out(f"  run {report.origin_id}: " + "; ".join(notes))
    for check in result.split:
        verdict = "inconclusive" if check.inconclusive else (
            "agrees" if check.agrees else "DISAGREES")
        out(f"{verdict} under a fresh split: {check.line()}")
    for check in result.pooled:
        out(f"{'agrees' if check.agrees else 'DISAGREES'}, the drawn runs' times together: "
            f"{check.line()}")
    out(tally(result.runs))
    unjudged = [r.origin_id for r in result.runs if any(
        c.inconclusive and c.tolerance.startswith("not judged: ") for c in r.checks)]
    if unjudged:
        out(f"times not judged for run(s) {', '.join(map(str, unjudged))}: this machine was "
            "too loaded while reproducing to judge times; reproduce on a quieter machine")


def _width(console: Any, table: Any) -> int:
    """The table's natural width (every cell on one line)."""
    from rich.measure import Measurement
    return Measurement.get(console, console.options.update_width(1 << 16), table).maximum


COMPARED = ("what must not depend on the machine: status, steps and epochs to the target, "
            "accuracies, evaluations, a validation's verdict, a network's agreement with the "
            "reference, node-test counts; times only on the run's own hardware")


def tally(runs: list[Any]) -> str:
    """The closing line: how many runs agree; where the others are only inconclusive, that
    (and why) instead of "0 of 1 run(s) agree", which read as a disagreement."""
    n, count = len(runs), Counter(r.verdict for r in runs)
    unsure = [r for r in runs if r.verdict == "inconclusive"]
    why = "; ".join(f"run {r.origin_id}: {_unsure(r)}" for r in unsure)
    if unsure and count["agrees"] + len(unsure) == n:
        rest = f"; the other {count['agrees']} agree" if count["agrees"] else ""
        return (f"{len(unsure)} of {n} run(s) inconclusive ({why}), none disagrees with the "
                f"package{rest} ({COMPARED})")
    return (f"{count['agrees']} of {n} run(s) agree with the package ({COMPARED})"
            + (f"; {len(unsure)} inconclusive ({why})" if unsure else ""))


def _unsure(report: Any) -> str:
    """Why a run's verdict is inconclusive, in a few words."""
    checks = [c for c in report.checks if c.inconclusive and not c.agrees]
    if any(c.tolerance.startswith("not judged: ") for c in checks):
        return "its times were not judged, this machine being too loaded while reproducing"
    if any("spent its time budget" in c.note for c in report.checks):
        return ("one of the two spent its time budget before the other's target step, the "
                "evaluations agreeing: machine speed, not the result")
    return "not judged: " + ", ".join(c.name for c in checks)


def fresh(result: Any, out: Any, console: Any) -> None:
    """`--fresh-seeds`: the draw, each fresh-seed run, then each result's verdict."""
    from rich.table import Table
    how = "given" if result.seed_given else "drawn"
    out(f"{result.package}: entry '{result.entry}', sha256 {result.sha256[:16]}…; "
        f"{result.fresh_seeds} fresh seed(s) per result drawn with seed {result.seed} ({how}; "
        f"`--seed {result.seed}` repeats them); recorded in {result.ledger}")
    table = Table(title_justify="left")
    for name in ("workload", "backend", "ranks", "fresh seed", "run", "status", "epochs"):
        table.add_column(name, overflow="fold")
    for r in result.runs:
        by = {c.name: c for c in r.checks}
        table.add_row(str(r.workload), str(r.backend), str(r.world_size or "-"),
                      "-" if r.seed is None else str(r.seed),
                      "-" if r.run_id is None else str(r.run_id),
                      show(by["status"].reproduced) if "status" in by else r.problem,
                      show(by["epochs"].reproduced) if "epochs" in by else "-")
    console.print(table)
    for r in result.runs:
        for line in r.disagreements():
            out(f"not run: {line}")
    for check in result.fresh:
        verdict = "inconclusive" if check.inconclusive else (
            "agrees" if check.agrees else "FLAGGED")
        out(f"{verdict}: {check.line()}")
    if any(r.run_id is not None for r in result.runs):
        out(f"scored: the boards of {result.ledger} rank each result re-run here on its "
            "fresh-seed runs (the organiser's seeds), its package's own seed runs listed beside "
            "it, unranked")


def as_json(result: Any) -> dict[str, Any]:
    return {"package": str(result.package), "sha256": result.sha256, "entry": result.entry,
            "seed": result.seed, "seed_given": result.seed_given, "ledger": str(result.ledger),
            "drawn_from": result.drawn_from, "left_out": result.left_out,
            "restarts": result.restarts,
            "odds": result.odds() if result.drawn_from and result.fresh_seeds is None
            else None,
            "agrees": result.agrees, "split_seed": result.split_seed,
            "fresh_seeds": result.fresh_seeds,
            "fresh": [{"check": c.name, "recorded": c.recorded, "reproduced": c.reproduced,
                       "tolerance": c.tolerance, "agrees": c.agrees,
                       "inconclusive": c.inconclusive, "note": c.note}
                      for c in result.fresh],
            "split": [{"check": c.name, "recorded": c.recorded, "reproduced": c.reproduced,
                       "agrees": c.agrees, "inconclusive": c.inconclusive, "note": c.note}
                      for c in result.split],
            "pooled": [{"check": c.name, "recorded": c.recorded, "reproduced": c.reproduced,
                        "tolerance": c.tolerance, "agrees": c.agrees, "note": c.note}
                       for c in result.pooled],
            "runs": [{"origin_run": r.origin_id, "level": r.level, "workload": r.workload,
                      "backend": r.backend, "seed": r.seed, "trial": r.trial,
                      "world_size": r.world_size, "run_id": r.run_id, "agrees": r.agrees,
                      "verdict": r.verdict,
                      "problem": r.problem, "threads": r.threads, "timing": r.timing,
                      "times": r.times,
                      "environment": r.environment,
                      "checks": [{"name": c.name, "recorded": c.recorded,
                                  "reproduced": c.reproduced, "tolerance": c.tolerance,
                                  "agrees": c.agrees, "inconclusive": c.inconclusive,
                                  "note": c.note} for c in r.checks]}
                     for r in result.runs]}
