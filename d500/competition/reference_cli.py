"""`d500 reference WORKLOAD [--entry NAME] [--backend B] [--runs N]`: the organiser measures a
workload's reference convergence (N seeded runs of an entry's default recipe, each a ledger run)
and prints the `reference_convergence` block for its workload file (--write puts it there).

A level-3 workload (given as a path, e.g. levels/3-distributed/digits-mlp.yaml, or by name with a
level-3 --entry) runs every seed as `mpiexec -n R d500 train` (R: --ranks, default 2).
"""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

from d500.cli import ArgumentParser, seed
from d500.errors import UsageError


def main(argv: list[str], prog: str = "d500 reference") -> int:
    from d500.competition import convergence, reference
    p = ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("workload", help="a level-2 or level-3 workload file, or a workload name")
    p.add_argument("--entry", metavar="NAME",
                   help="an example entry's name or a submission folder (default: "
                        + ", ".join(f"{v} at level {k}" for k, v in
                                    reference.DEFAULT_ENTRY.items()) + ")")
    p.add_argument("--backend", default="torch", help="a trainable backend (default torch)")
    p.add_argument("--runs", type=int, default=20, metavar="N",
                   help=f"reference runs, distinct seeds (default 20, at least "
                        f"{convergence.MIN_SAMPLES})")
    p.add_argument("--first-seed", type=seed, default=reference.FIRST_SEED, metavar="S",
                   help=f"the seeds are S, S+1, ... (default {reference.FIRST_SEED})")
    p.add_argument("--ranks", type=int, metavar="R",
                   help="level 3: the world size (default 2 when the workload allows it)")
    p.add_argument("--data", metavar="DIR", help="where dataset files are (default $D500_DATA)")
    p.add_argument("--keep-time-budget", action="store_true",
                   help="keep the workload's budget.max_seconds (default: lifted, since epochs "
                        "to target do not depend on the machine)")
    p.add_argument("--write", action="store_true",
                   help="also put the block into the workload file (replacing its block)")
    args = p.parse_args(argv)
    if args.runs < convergence.MIN_SAMPLES:
        raise UsageError(f"--runs must be at least {convergence.MIN_SAMPLES} (a reference's "
                         f"smallest number of samples)")

    from d500 import backends
    from d500.ledger import Ledger
    from d500.training.console import line, progress_bar, resolve
    backends.get(args.backend)
    entry_dir = _entry_folder(args.entry, _level(args.workload, args.entry))
    workload, entry = resolve(Namespace(workload=args.workload, submission=str(entry_dir)))
    measured = reference.measure(
        workload, entry, args.backend, args.runs, first_seed=args.first_seed, ranks=args.ranks,
        ledger=Ledger(), data_dir=args.data, progress=progress_bar,
        keep_time_budget=args.keep_time_budget,
        on_run=lambda s, result: print(line(workload, s, result), file=sys.stderr, flush=True))
    text = reference.block(measured)
    print(f"{len(measured.seeds)} runs in {measured.seconds:.0f} s", file=sys.stderr)
    print(text, end="")
    if args.write:
        reference.write_block(Path(workload.path), text)
        from d500 import levels
        levels.of_file(workload.path).load(workload.path)  # the file still loads
        print(f"written to {workload.path}", file=sys.stderr)
    return 0


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
        known = ", ".join(sorted(f.parent.name for f in examples().glob("*/submission.yaml")))
        raise UsageError(f"--entry {name}: neither a submission folder nor an example entry "
                         f"(known: {known})")
    return folder
