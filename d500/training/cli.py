"""`d500 train WORKLOAD --submission DIR`: level-2 training runs (one per seed), each a ledger run
with its evaluations and MLLOG; a progress bar shows the step, the loss and the last validation
accuracy; a level-3 entry's runs go under MPI (`mpiexec -n N d500 train ...`). Exit 0 when every
run met the target, 1 when one missed, diverged or failed."""

from __future__ import annotations

import json
from typing import Any

from d500.cli import count, run_id, seed, stdout_console
from d500.errors import CheckFailed, UsageError
from d500.training.console import (
    configure_threads,
    line,
    parser,
    print_whole,
    progress_bar,
    resolve,
)
from d500.training.precision import precision_of


def main(argv: list[str], prog: str = "d500 train") -> int:
    from d500.distributed.launch import launched_by_mpi, share_cores
    if launched_by_mpi():
        share_cores()  # before a framework is imported
    p = parser(prog, __doc__.split("\n\n")[0])
    p.add_argument("--seed", type=seed,
                   help="one exploration run with this seed (listed, never scored)")
    p.add_argument("--seeds", type=count, metavar="N",
                   help="run only the first N of the workload's required seeds not yet run "
                        "(default: all of them; the rules choose the seeds)")
    p.add_argument("--repeat", action="store_true",
                   help="allow --seed to repeat a seed already recorded")
    p.add_argument("--show-partition", action="store_true",
                   help="level 3, an entry with pipeline > 1: print how the model is cut into "
                        "stages (nodes, FLOPs, tensors crossing); with tensor > 1: which "
                        "weights are split how; and train nothing")
    from d500.training.resume import every
    p.add_argument("--checkpoint-every", type=every, metavar="K",
                   help="write a checkpoint every K epochs under the run's folder")
    p.add_argument("--resume", type=run_id, metavar="RUN",
                   help="continue the killed or interrupted run RUN from its last checkpoint")
    args = p.parse_args(argv)
    from d500.distributed import cli as distributed
    if args.show_partition or distributed.wanted(args):  # a level-3 workload, any `d500 train`
        return distributed.train(args, argv, prog)  # under mpiexec, or a cut to show: not trained
    workload, entry = resolve(args)  # the cheap checks first: no framework imported yet
    seed_count(args, workload)
    return train_level2(args, workload, entry)


def train_level2(args: Any, workload: Any, entry: Any) -> int:
    """The level-2 runs of `d500 train`, one per seed, each printed as one line."""
    from d500 import backends, progress
    from d500.ledger import Ledger
    from d500.training.trainer import preflight, train

    # What the ledger refuses (a wrong --resume RUN, a --seed already run) is said before
    # backends.get imports the framework; a terminal sees each step until the first run's bar.
    with progress.shown(f"{workload.name} / {entry.name} / {args.backend}"):
        progress.step("reading the ledger")
        ledger = Ledger()
        checkpoints, resumed = restarts(ledger, workload, entry, args)
        seeds = ([resumed.meta["seed"]] if resumed is not None
                 else choose_seeds(ledger, workload, entry, args))
        if seeds:
            backends.get(args.backend)  # its step names the framework it loads
            progress.step("counting the idle cores")
            configure_threads(args, resumed_threads(args))  # after the cheap checks, before
            progress.step("checking the model")  # the framework runs anything
            preflight(workload, entry.recipe, args.backend, args.data)
    if not seeds:  # said before the framework loads (torch: 5-9 s), as nothing runs
        done_line(workload, args)
        if args.json:
            print("[]")
        return 0
    out = stdout_console()
    results = []
    for s in seeds:
        with progress_bar(f"{workload.name} / {entry.name} / {args.backend} seed {s}") as bar:
            result = train(workload, entry.recipe, args.backend, s, ledger=ledger,
                           data_dir=args.data, submission=entry.name,
                           submission_files=entry.files, progress=bar,
                           checkpoints=checkpoints, resume=resumed)
        if checkpoints is not None:
            checkpoints = type(checkpoints)(checkpoints.every)  # the next seed's own
        results.append((s, result))
        if not args.json:
            print_whole(line(workload, s, result) + note(workload, entry, args.backend, s), out)
    if args.json:
        print(json.dumps([{"seed": s, "run_id": r.run_id, "status": r.status,
                           "exploration": exploration(workload, entry, args.backend, s),
                           "figures": r.figures, "error": r.error} for s, r in results],
                         indent=1, default=str))
    return reached(results)


def reached(results: list[tuple[int, Any]]) -> int:
    """0 where every seed's run (seed, result) reached the target, else a CheckFailed naming how
    many did not and the first of them (level 2's and level 3's `d500 train`)."""
    bad = [(s, r) for s, r in results if r.status != "succeeded"]
    if bad:
        s, r = bad[0]
        raise CheckFailed(f"{len(bad)} of {len(results)} run(s) did not reach the target; "
                          f"seed {s}: {r.status}: {r.error}")
    return 0


def resumed_threads(args: Any) -> tuple[int, str] | None:
    """--resume without --threads: the thread count the resumed run recorded, and why (the
    default follows the machine's load, and a resumed run must compute as its first part did);
    None otherwise, or where the run recorded none (resume.plan judges the run itself)."""
    if args.resume is None or args.threads is not None:
        return None
    from d500.errors import D500Error
    from d500.ledger import Ledger
    try:
        recorded = (Ledger().get(args.resume).get("provenance") or {}).get("threads") or {}
    except D500Error:
        return None
    count = recorded.get("count")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        return None
    return count, f"the resumed run {args.resume} recorded it ({recorded.get('set_by')})"


def restarts(ledger: Any, workload: Any, entry: Any, args: Any, **scope: Any
             ) -> tuple[Any, Any]:
    """--checkpoint-every and --resume, checked before anything is recorded: (Checkpoints or
    None, Resumed or None) (d500.training.resume; `scope`: level 3's hyperparameters and world
    size, for resume.plan)."""
    import tempfile

    from d500.training import checkpoint, resume
    if (args.checkpoint_every or args.resume is not None) and entry.recipe.native:
        checkpoint.supported(args.backend, entry.recipe.native)
    checkpoints = None
    if args.checkpoint_every:
        runs = ledger.root / "runs"
        try:  # a real write: permissions, a read-only disk, a file where the folder goes
            runs.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=runs):
                pass
        except OSError as err:
            raise UsageError(f"{runs}: cannot write checkpoints there "
                             f"({err.strerror or err})") from None
        checkpoints = resume.Checkpoints(args.checkpoint_every)
    if args.resume is None:
        return checkpoints, None
    if args.seed is not None or args.seeds is not None:
        raise UsageError("--resume continues its run's seed: give no --seed or --seeds")
    resumed = resume.plan(ledger, args.resume, workload, entry, args.backend, **scope)
    if checkpoints is None:  # a resumed run checkpoints as its first segment did
        checkpoints = resume.Checkpoints(int(resumed.meta["every"]))
    return checkpoints, resumed


def choose_seeds(ledger: Any, workload: Any, entry: Any, args: Any, world: int = 1
                 ) -> list[int]:
    """The seeds to run: the workload's required seeds (d500.training.seeds) not yet run to an
    end (an interrupted one runs again), the first --seeds N of them; or --seed S (refused if
    recorded, unless --repeat), an exploration unless S is one of the required seeds."""
    from d500.training.seeds import ENDED, required
    runs = [r for r in ledger.runs(level=workload.level, workload=workload.name)
            if r["submission"] == entry.name and r["backend"] == args.backend
            and r["study"] is None and r["seed"] is not None
            and precision_of(r) == entry.recipe.precision]  # another precision: another row
    used = {r["seed"]: r["id"] for r in runs}
    seed_count(args, workload)
    if args.seed is not None:
        if args.seed in used and not args.repeat:
            raise UsageError(f"seed {args.seed} was already used by run {used[args.seed]} of "
                             f"this entry; pass --repeat to measure it again")
        return [args.seed]
    ended = {r["seed"] for r in runs if r["status"] in ENDED}
    todo = [s for s in required(workload.level, workload.name, entry.name, args.backend,
                                workload.seed_runs, world) if s not in ended]
    return todo[:args.seeds] if args.seeds is not None else todo


def seed_count(args: Any, workload: Any) -> None:
    """--seeds N within the workload's required seed runs, and not beside --seed (checked before
    a framework loads)."""
    if args.seed is not None and args.seeds is not None:
        raise UsageError("give --seed or --seeds, not both")
    if args.seeds is not None and not 1 <= args.seeds <= workload.seed_runs:
        raise UsageError(f"--seeds must be 1 to {workload.seed_runs}: workload "
                         f"'{workload.name}' requires {workload.seed_runs} seed run(s), and a run "
                         f"with another seed (--seed S) is an exploration, never scored")


def note(workload: Any, entry: Any, backend: str, seed_: int, world: int = 1) -> str:
    """What a result line adds for an exploration run."""
    return (" (exploration: a seed the rules did not choose, never scored)"
            if exploration(workload, entry, backend, seed_, world) else "")


def done_line(workload: Any, args: Any) -> None:
    """The line of a `d500 train` with nothing left to run, on stderr."""
    import sys
    print(f"{workload.name}: every one of its {workload.seed_runs} required seed run(s) on "
          f"{args.backend} already ran to an end; `--seed S` runs an exploration (never "
          "scored)", file=sys.stderr)


def exploration(workload: Any, entry: Any, backend: str, seed_: int, world: int = 1) -> bool:
    """Whether a seed run is an exploration (its seed not one the rules require: not scored)."""
    from d500.training.seeds import required
    return seed_ not in required(workload.level, workload.name, entry.name, backend,
                                 workload.seed_runs, world)
