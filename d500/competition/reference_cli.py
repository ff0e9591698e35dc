"""`d500 reference WORKLOAD [--entry NAME] [--backend B] [--runs N]`: the organiser measures a
workload's reference convergence (N seeded runs of an entry's default recipe, each a ledger run)
and prints the `reference_convergence` block for its workload file (--write puts it there).

A seed already run the same way in this ledger is not trained again (level 2: a measurement
stopped part-way continues; d500.competition.reference.recorded); --fresh trains every seed anew.

A level-3 workload (given as a path, e.g. levels/3-distributed/digits-mlp.yaml, or by name with a
level-3 --entry) runs every seed as `mpiexec -n R d500 train` (R: --ranks, default 2).

Reference trials (d500.competition.trial_reference): `--at K=V ...` runs the entry at that
hyperparameter point instead of its default recipe, `--trials PACKAGE` at the point of each study's
best trial in a package (N runs each); they print JSON, and --write puts them in the file beside
the workload (<workload>.trials.json), where `d500 check` finds them.
"""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

from d500 import paths
from d500.cli import ArgumentParser, count, seed
from d500.errors import ConfigError, UsageError
from d500.training.precision import PRECISIONS


def main(argv: list[str], prog: str = "d500 reference") -> int:
    from d500.competition import convergence, reference
    p = ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("workload", help="a level-2 or level-3 workload file, or a workload name")
    p.add_argument("--entry", metavar="NAME",
                   help="an example entry's name or a submission folder (default: "
                        + ", ".join(f"{v} at level {k}" for k, v in
                                    reference.DEFAULT_ENTRY.items()) + ")")
    p.add_argument("--backend", default="torch", help="a trainable backend (default torch)")
    p.add_argument("--runs", type=count, default=20, metavar="N",
                   help=f"reference runs, distinct seeds (default 20, at least "
                        f"{convergence.MIN_SAMPLES})")
    p.add_argument("--first-seed", type=seed, default=reference.FIRST_SEED, metavar="S",
                   help=f"the seeds are S, S+1, ... (default {reference.FIRST_SEED})")
    p.add_argument("--ranks", type=count, metavar="R",
                   help="level 3: the world size (default 2 when the workload allows it)")
    paths.add_data_option(p)
    p.add_argument("--precision", choices=PRECISIONS,
                   help="the runs compute in this precision, in place of the entry's; the block "
                        "is `reference_convergence_<precision>` (results are checked only "
                        "against a reference in their own precision)")
    p.add_argument("--keep-time-budget", action="store_true",
                   help="keep the workload's budget.max_seconds (default: lifted, since epochs "
                        "to target do not depend on the machine)")
    p.add_argument("--write", action="store_true",
                   help="also put the block into the workload file (replacing its block); "
                        "with --at/--trials: into <workload>.trials.json beside it")
    p.add_argument("--fresh", action="store_true",
                   help="train every seed anew (default: a seed already run the same way, in "
                        "this ledger, counts as it ended)")
    p.add_argument("--at", action="append", default=[], metavar="K=V", type=_point,
                   help="reference trials: run at this hyperparameter (repeat for a point: "
                        "--at lr=0.1 --at momentum=0.9)")
    p.add_argument("--trials", metavar="PACKAGE",
                   help="reference trials at each study's best trial of a package (this "
                        "workload and backend)")
    args = p.parse_args(argv)
    if args.at and args.trials:
        raise UsageError("--at and --trials: give one point, or a package's best trials")
    if args.runs < convergence.MIN_SAMPLES:
        raise UsageError(f"--runs must be at least {convergence.MIN_SAMPLES} (a reference's "
                         f"smallest number of samples)")

    from d500 import backends
    from d500.ledger import Ledger
    from d500.training.console import line, progress_bar, resolve
    entry_dir = _entry_folder(args.entry, _level(args.workload, args.entry))
    workload, entry = resolve(Namespace(workload=args.workload, submission=str(entry_dir),
                                        precision=args.precision, data=args.data))
    points = None  # --at or --trials: the points, their hyperparameters checked
    if args.at or args.trials:
        points = [dict(args.at)] if args.at else _best_points(args.trials, workload, entry,
                                                              args.backend)
        try:
            entry.validate(points)
        except ConfigError as err:  # --at lr=x: its value, not the entry's file, is wrong
            if not args.at:
                raise
            given = " ".join(f"--at {k}={v}" for k, v in args.at)
            raise UsageError(f"{given}: {str(err).split('submission.yaml: ', 1)[-1]}") from None
    backends.get(args.backend)  # after the cheap checks: it imports the framework
    from d500.training.trainer import preflight  # an inference-only backend refused here, not
    preflight(workload, entry.recipe, args.backend, args.data)  # at the first run's start
    def measure(params: dict[str, Any] | None = None) -> Any:
        return reference.measure(
            workload, entry, args.backend, args.runs, first_seed=args.first_seed,
            ranks=args.ranks, ledger=Ledger(), data_dir=args.data, progress=progress_bar,
            keep_time_budget=args.keep_time_budget, params=params, fresh=args.fresh,
            on_run=lambda s, result: print(line(workload, s, result), file=sys.stderr,
                                           flush=True))

    if points is not None:
        return _trials(points, measure, workload, args.write)
    measured = measure()
    text = reference.block(measured)
    print(f"{len(measured.seeds)} runs in {measured.seconds:.0f} s", file=sys.stderr)
    if measured.reused:
        print(f"{len(measured.reused)} of them recorded before (seeds "
              f"{', '.join(map(str, measured.reused))}; --fresh trains them anew)",
              file=sys.stderr)
    print(text, end="")
    if args.write:
        reference.write_block(Path(workload.path), text, measured.precision)
        from d500 import levels
        levels.of_file(workload.path).load(workload.path)  # the file still loads
        print(f"written to {workload.path}", file=sys.stderr)
    return 0


def _point(text: str) -> tuple[str, Any]:
    """argparse type of --at: KEY=VALUE, the value read as YAML (a number, a name)."""
    import argparse

    import yaml
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), yaml.safe_load(value)


def _trials(points: list[dict[str, Any]], measure: Any, workload: Any, write: bool) -> int:
    """Reference runs at each point: the entries printed as JSON, written beside the
    workload with --write."""
    import json

    from d500.competition import reference, trial_reference
    out = []
    for params in points:
        measured = measure(params)
        first = measured.seeds[0]
        ref = trial_reference.of_measurement(measured, reference.command(measured, first))
        print(f"{len(measured.seeds)} runs at {params} in {measured.seconds:.0f} s: "
              f"{reference._number(min(ref.samples))}-{reference._number(max(ref.samples))} "
              f"{ref.metric}", file=sys.stderr)
        out.append(ref)
        if write:
            trial_reference.write(trial_reference.path_of(workload.path), ref)
    print(json.dumps({"trials": [r.as_dict() for r in out]}, indent=1))
    if write:
        print(f"written to {trial_reference.path_of(workload.path)}", file=sys.stderr)
    return 0


def _best_points(package: str, workload: Any, entry: Any, backend: str) -> list[dict[str, Any]]:
    """The point of each study's best trial in a package (this workload and backend): the
    hyperparameters it recorded, less those the reference entry does not know (an entry's
    own, its optimizer's name)."""
    from d500.competition.completeness import group_studies
    from d500.competition.package import Package
    from d500.competition.trial_reference import best_trial
    from d500.errors import D500Error
    pkg = Package.open(package)
    studies, _ = group_studies(pkg.runs(), list(pkg.studies()))
    found = studies.get((workload.level, workload.name, backend), {})
    if not found:
        raise D500Error(f"{package}: no study of {workload.name} on {backend}")
    known = set(entry.recipe.hp())
    points: list[dict[str, Any]] = []
    for _, study in sorted(found.items()):
        run = best_trial(study.trials, workload.trials)
        if run is None:
            print(f"{study.label}: no trial reached the target", file=sys.stderr)
            continue
        params = {}  # its recorded hyperparameters, as the points of a search space name them
        for key, value in run.hyperparameters.items():
            if key in known or key == "batch_size":
                params[key] = value
            elif key == "schedule":
                params["schedule.name"] = value
            elif key.startswith("schedule_"):
                params[f"schedule.{key[len('schedule_'):]}"] = value
        if params not in points:
            points.append(params)
    if not points:
        raise D500Error(f"{package}: no study of {workload.name} on {backend} has a trial that "
                        f"reached the target")
    return points


def _level(workload: str, entry: str | None) -> int:
    """The level whose default entry applies: the workload file's, else the entry's, else 2."""
    from d500.workload import read_yaml
    for candidate in (Path(workload), *([_entry_folder(entry, 2) / "submission.yaml"]
                                        if entry else [])):
        if candidate.is_file():
            _, data = read_yaml(candidate)
            if isinstance(data, dict) and data.get("level") in (2, 3):
                return data["level"]
    return 2


def _entry_folder(entry: str | None, level: int) -> Path:
    """A submission folder: the path given, or an example entry's folder by name."""
    from d500.competition.reference import DEFAULT_ENTRY
    from d500.paths import examples
    name: Any = entry or DEFAULT_ENTRY[level]
    given = Path(name)
    if given.is_dir() or given.name == "submission.yaml":
        return given if given.is_dir() else given.parent
    folder = examples() / name
    if not (folder / "submission.yaml").is_file():
        from d500.paths import no_entry
        raise UsageError(f"--entry {name}: {no_entry(name)}")  # the closest named too
    return folder
