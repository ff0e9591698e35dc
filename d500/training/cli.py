"""`d500 train WORKLOAD --submission DIR`: level-2 training runs (one per seed), each a ledger run
with its evaluations and MLLOG; a progress bar shows the step, the loss and the last validation
accuracy. Exit 0 when every run met the target, 1 when one missed, diverged or failed."""

from __future__ import annotations

import json
from typing import Any

from d500.cli import seed, stdout_console
from d500.errors import CheckFailed, UsageError
from d500.training.console import configure_threads, line, parser, progress_bar, resolve


def main(argv: list[str], prog: str = "d500 train") -> int:
    from d500.distributed.launch import launched_by_mpi, share_cores
    if launched_by_mpi():
        share_cores()  # before a framework is imported
    p = parser(prog, __doc__.split("\n\n")[0])
    p.add_argument("--seed", type=seed, help="one run with this seed")
    p.add_argument("--seeds", type=int, metavar="N",
                   help="N runs with the N lowest seeds this entry has not used on this "
                        "workload and backend (default: 1)")
    p.add_argument("--repeat", action="store_true",
                   help="allow --seed to repeat a seed already recorded")
    args = p.parse_args(argv)
    from d500.distributed import cli as distributed
    if distributed.wanted(args):  # a level-3 workload, or any `d500 train` under mpiexec
        return distributed.train(args, argv, prog)
    from d500 import backends

    workload, entry = resolve(args)  # the cheap checks first: no framework imported yet
    backends.get(args.backend)
    return train_level2(args, workload, entry)


def train_level2(args: Any, workload: Any, entry: Any) -> int:
    """The level-2 runs of `d500 train`, one per seed, each printed as one line."""
    from d500.ledger import Ledger
    from d500.training.trainer import preflight, train

    configure_threads(args)  # after the cheap checks, before the framework runs anything
    preflight(workload, entry.recipe, args.backend, args.data)  # bad input: one line, no run
    ledger = Ledger()
    seeds = choose_seeds(ledger, workload, entry, args)
    out = stdout_console()
    results = []
    for s in seeds:
        with progress_bar(f"{workload.name} / {entry.name} / {args.backend} seed {s}") as bar:
            result = train(workload, entry.recipe, args.backend, s, ledger=ledger,
                           data_dir=args.data, submission=entry.name,
                           submission_files=entry.files, progress=bar)
        results.append((s, result))
        if not args.json:
            out.print(line(workload, s, result), highlight=False)
    if args.json:
        print(json.dumps([{"seed": s, "run_id": r.run_id, "status": r.status,
                           "figures": r.figures, "error": r.error} for s, r in results],
                         indent=1, default=str))
    bad = [(s, r) for s, r in results if r.status != "succeeded"]
    if bad:
        s, r = bad[0]
        raise CheckFailed(f"{len(bad)} of {len(results)} run(s) did not reach the target; "
                          f"seed {s}: {r.status}: {r.error}")
    return 0


def choose_seeds(ledger: Any, workload: Any, entry: Any, args: Any) -> list[int]:
    """Distinct seeds, never reused by accident: --seed (refused if recorded, unless --repeat)
    or the N lowest unused ones."""
    used = {r["seed"]: r["id"] for r in ledger.runs(level=workload.level,
                                                    workload=workload.name)
            if r["submission"] == entry.name and r["backend"] == args.backend
            and r["study"] is None and r["seed"] is not None}
    if args.seed is not None:
        if args.seeds is not None:
            raise UsageError("give --seed or --seeds, not both")
        if args.seed in used and not args.repeat:
            raise UsageError(f"seed {args.seed} was already used by run {used[args.seed]} of "
                             f"this entry; pass --repeat to measure it again")
        return [args.seed]
    n = 1 if args.seeds is None else args.seeds
    if n < 1:
        raise UsageError("--seeds must be at least 1")
    out, s = [], 0
    while len(out) < n:
        if s not in used:
            out.append(s)
        s += 1
    return out
