"""`mpiexec -n N d500 train levels/3-distributed/WORKLOAD.yaml --submission DIR`: the level-3 side
of `d500 train` (d500.training.cli hands over here). Every rank runs the same command; they first
compare digests of the command line, the workload file and the submission folder; every check that
follows fails on all ranks alike (one line each, exit 2, no rank left waiting). Rank 0 picks the
seeds (the rules' required seeds at this world size), records each run and prints its line; the
other ranks print only errors.

`d500 train` of a level-3 workload without an MPI launcher, at a world size the workload does not
allow, or of an entry naming an unknown scheme is refused the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from d500.distributed.launch import launched_by_mpi
from d500.errors import D500Error, UsageError


def wanted(args: Any) -> bool:
    """Whether `d500 train` goes through here: under an MPI launcher (any workload: the ranks
    must agree before anything else), or for a level-3 workload (to refuse it without MPI)."""
    if launched_by_mpi():
        return True
    return declared_level(args) == 3


def declared_level(args: Any) -> int | None:
    """The `level:` a workload argument's file declares, or its entry's level when the workload
    is a name (None when neither can be read: level 2 reports the problem)."""
    from d500.workload import read_yaml
    for candidate in (Path(args.workload), Path(args.submission) / "submission.yaml",
                      Path(args.submission)):
        try:
            if candidate.is_file():
                _, data = read_yaml(candidate)
                if isinstance(data, dict) and isinstance(data.get("level"), int):
                    return data["level"]
        except D500Error:
            return None
    return None


def _suggested_ranks(allowed: Any) -> tuple[int, str]:
    """The most ranks the workload allows that this machine's cores hold (more than one where
    allowed), and a note when even the fewest would oversubscribe it."""
    from d500.provenance import usable_cores
    cores = usable_cores()
    several = [r for r in allowed if r > 1] or list(allowed)
    fitting = [r for r in several if r <= cores]
    if fitting:
        return max(fitting), ""
    n = min(several)
    return n, (f" ({n} ranks on this machine's {cores} core(s) oversubscribe it: they run, "
               f"but share the cores, and the runs are marked so)")


def train(args: Any, argv: list[str], prog: str) -> int:
    """The level-3 runs of one `d500 train` command on this rank."""
    from d500.training.console import resolve
    if getattr(args, "show_partition", False):
        return show_partition(args)
    if not launched_by_mpi():
        workload, _ = resolve(args)
        n, note = _suggested_ranks(getattr(workload, "ranks", (2,)))
        raise UsageError(f"{workload.path}: '{workload.name}' is a level-3 (distributed) "
                         f"workload: run it under MPI, e.g. mpiexec -n {n} d500 train "
                         f"{args.workload} --submission {args.submission}{note}")
    from d500 import children, progress
    progress.behind_terminal()  # whether mpiexec's stderr is a terminal: while /proc says
    children.keep(forward=True)  # a keeper per rank, split before MPI starts (no namespace:
    #                              MPI's peers on this host read this rank's memory by pid)
    from d500.distributed import cover
    from d500.paths import entry as entry_path
    cover.start(entry_path(args.submission))  # the helper that starts the judges and covers
    #                                           $D500_HOME before the entry's code (capable)
    children.confine()  # a rank runs the entry's code: first, before MPI starts any thread
    from d500.distributed import faults
    faults.ignore_launcher_notices()  # hydra's notice of a rank's exit must not end this one
    with contextlib.ExitStack() as starting:  # rank 0, where mpiexec's stderr is a terminal:
        starting.enter_context(progress.shown(prog))  # each step until the first run's bar
        progress.step("starting MPI")
        from mpi4py import MPI

        from d500.distributed import agreement
        world = MPI.COMM_WORLD
        progress.step(f"comparing the {world.Get_size()} ranks' inputs")
        agreement.agree_on_inputs(world, [
            ("the command line", lambda: hashlib.sha256("\0".join(argv).encode()).digest()),
            ("the workload file", lambda: agreement.digest_files(_workload_file(args))),
            ("the submission folder", lambda: agreement.digest_files(args.submission)),
        ])
        progress.step("checking the entry")
        workload, entry, spec = agreement.together(world,
                                                   lambda: _checked(args, world.Get_size()))
        if workload.level == 2:
            starting.close()
            cover.close()  # (the level-2 judge is this process)
            from d500.training.cli import train_level2
            return train_level2(args, workload, entry)
        return _run(args, world, workload, entry, spec, starting)


def show_partition(args: Any) -> int:
    """`d500 train WORKLOAD --submission DIR --show-partition`: the entry's pipeline cut (or
    tensor split) of the workload's model, printed (as each run records it in its details);
    nothing trains. Under mpiexec rank 0 prints it, once; every rank checks alike (a mistake is
    each rank's one line, as for a run)."""
    import contextlib
    import io

    from d500.distributed.launch import launcher_rank
    if launcher_rank() in (None, 0):
        return _show_partition(args)
    with contextlib.redirect_stdout(io.StringIO()):
        return _show_partition(args)


def _show_partition(args: Any) -> int:
    from d500.distributed import spec as specs
    from d500.training.console import resolve
    workload, entry = resolve(args)
    if workload.level != 3:
        raise UsageError(f"{workload.path}: --show-partition shows a level-3 entry's pipeline "
                         f"stages; '{workload.name}' is a level-{workload.level} workload")
    spec = specs.parse(entry.distributed, entry.path)
    if getattr(args, "json", False):
        return _partition_json(workload, entry, spec)
    if spec.tensor > 1 and spec.pipeline > 1:
        return _show_composed(workload, entry, spec)
    if spec.tensor > 1:
        print(f"{workload.name} / {entry.name}: tensor parallel, {spec.tensor} ways")
        print(tensor_split(workload, spec).show())
        return 0
    if spec.pipeline < 2:
        raise UsageError(f"{entry.path}: field 'distributed.pipeline' is {spec.pipeline}: "
                         f"there is no cut to show (declare pipeline: 2 or more, or tensor: 2 "
                         f"or more)")
    part = cut(workload, spec)
    data = f", {spec.data} data groups ({spec.data * spec.pipeline} ranks)" if spec.data else ""
    print(f"{workload.name} / {entry.name}: {spec.pipeline} stages, {spec.micro_batches} "
          f"micro-batches, {spec.schedule}{data}")
    print(part.show())
    return 0


def _partition_json(workload: Any, entry: Any, spec: Any) -> int:
    """--show-partition --json: the cut and each split as the run's details record them."""
    import json
    if spec.pipeline < 2 and spec.tensor < 2:
        raise UsageError(f"{entry.path}: field 'distributed.pipeline' is {spec.pipeline}: "
                         f"there is no cut to show (declare pipeline: 2 or more, or tensor: 2 "
                         f"or more)")
    out: dict[str, Any] = {"workload": workload.name, "entry": entry.name,
                           "pipeline": spec.pipeline, "tensor": spec.tensor}
    if spec.pipeline > 1:
        part = cut(workload, spec)
        out.update(micro_batches=spec.micro_batches, schedule=spec.schedule,
                   partition=part.record())
        if spec.tensor > 1:
            from d500.distributed.tensor.split import find
            out["splits"] = [find(part.model(s.index), spec.tensor).record()
                             for s in part.stages]
    else:
        out["split"] = tensor_split(workload, spec).record()
    print(json.dumps(out, indent=1))
    return 0


def _show_composed(workload: Any, entry: Any, spec: Any) -> int:
    """The cut between the tensor blocks, then each stage's split over its tensor group."""
    from d500.distributed.tensor.split import find
    part = cut(workload, spec)
    print(f"{workload.name} / {entry.name}: {spec.pipeline} stages, each split {spec.tensor} "
          f"ways, {spec.micro_batches} micro-batches, {spec.schedule}")
    print(part.show())
    for s in part.stages:
        print(f"\nstage {s.index} over its {spec.tensor} tensor ranks:")
        print(find(part.model(s.index), spec.tensor).show())
    return 0


def cut(workload: Any, spec: Any) -> Any:
    """The workload's model cut into the entry's spec.pipeline stages, between its tensor
    blocks where spec.tensor > 1 (a Partition; shapes alone decide it, so any seed's model gives
    the same); a UsageError where it cannot be."""
    from d500.distributed.pipeline.partition import cut as made
    from d500.training.data import dataset as datasets
    shape, classes = datasets.shape_of(workload.dataset)
    return made(workload.build_model(0, shape, classes), spec,
                where=f"{spec.where}: field 'distributed.pipeline'")


def tensor_split(workload: Any, spec: Any) -> Any:
    """The workload's model split spec.tensor ways (a tensor.split.Split); a UsageError where it
    has nothing to split."""
    from d500.distributed.tensor.split import find
    from d500.training.data import dataset as datasets
    shape, classes = datasets.shape_of(workload.dataset)
    return find(workload.build_model(0, shape, classes), spec.tensor,
                where=f"{spec.where}: field 'distributed.tensor'")


def _workload_file(args: Any) -> Path:
    """The workload file the argument names (a path, or a name in the entry's level folder);
    a name that finds nothing digests as missing; a folder of the workload's name in the
    current folder is not the workload (it was digested whole)."""
    p = Path(args.workload)
    if p.is_file() or (p.suffix in (".yaml", ".yml") and not p.exists()):
        return p
    try:
        from d500.training.console import resolve
        return resolve(args)[0].path
    except D500Error:
        return p


def _checked(args: Any, world: int) -> tuple[Any, Any, Any]:
    """The workload, entry and distributed spec, checked for this world size (the same on every
    rank, since they agreed on the files)."""
    import dataclasses

    from d500 import backends
    from d500.distributed import spec as specs
    from d500.training.console import resolve
    from d500.training.trainer import within_rules
    workload, entry = resolve(args)
    from d500.training.cli import seed_count
    seed_count(args, workload)  # --seeds N within the workload's, before any framework loads
    if workload.level != 3:
        if world > 1:  # said before the backend's framework loads (torch: 5-9 s)
            raise UsageError(f"{workload.path}: '{workload.name}' is a level-2 workload: it "
                             f"trains in one process (drop mpiexec; `mpiexec -n K d500 tune` "
                             f"shares tuning trials among ranks)")
        backends.get(args.backend)
        return workload, entry, None
    spec = specs.parse(entry.distributed, entry.path)  # the cheap checks before any framework
    workload.check_world(world)
    spec.dims(world)  # data x pipeline x tensor == the world size
    if spec.pipeline > 1:
        cut(workload, spec)  # a cut that cannot be made: refused before any framework
    if spec.tensor > 1:
        tensor_split(workload, spec)  # likewise a model with nothing to split
    workload.check_batch(entry.recipe.batch_size, world, str(entry.path))
    global_recipe = dataclasses.replace(entry.recipe,
                                        batch_size=workload.global_batch(
                                            entry.recipe.batch_size, world))
    share = global_recipe.batch_size // spec.dims(world)["data"]  # a pipeline's samples a step
    if spec.pipeline > 1 and spec.micro_batches > share:  # ran min(M, share), recorded M
        raise UsageError(f"{entry.path}: field 'distributed.micro_batches' is "
                         f"{spec.micro_batches}, more than the {share} samples each pipeline "
                         f"gets a step (global batch {global_recipe.batch_size} over "
                         f"{spec.dims(world)['data']} data group(s)): at most {share}")
    if spec.native and args.backend != "torch":  # said before that backend's framework loads
        raise UsageError(f"{entry.path}: the {spec.scheme} baseline is torch's own "
                         f"({spec.scheme.upper()}): run it with --backend torch, not "
                         f"{args.backend}")
    within_rules(workload, global_recipe, args.data)  # the recipe (fp32), before the ledger
    if args.checkpoint_every or args.resume is not None:
        from d500.distributed.resuming import check
        check(spec, entry, args.backend, workload)  # a scheme that cannot checkpoint
    return workload, entry, spec


def _loaded(args: Any, workload: Any, entry: Any, world: int) -> None:
    """The checks that load the backend's framework (d500.training.trainer.preflight: the
    framework and the model, after the rules `_checked` made), made once rank 0 found seeds to
    run."""
    import dataclasses

    from d500.training.trainer import preflight
    global_recipe = dataclasses.replace(entry.recipe, batch_size=workload.global_batch(
        entry.recipe.batch_size, world))
    preflight(workload, global_recipe, args.backend, args.data)


def _run(args: Any, world: Any, workload: Any, entry: Any, spec: Any,
         starting: contextlib.ExitStack) -> int:
    """The level-3 runs on this rank; `starting` (rank 0's steps on a terminal) closed once
    the first run opens, before its bar."""
    from d500 import progress
    from d500.distributed import agreement, faults
    from d500.distributed.comm import Communicator
    from d500.distributed.trainer import Job, judges
    from d500.distributed.trainer import train as train_run
    from d500.training.console import configure_threads, line

    rank, size = world.Get_rank(), world.Get_size()
    limit = faults.limit()
    comm = Communicator(world if size > 1 else None)
    job = Job(comm, workload, entry, spec, args.backend, data_dir=args.data, limit=limit,
              checkpoint_every=args.checkpoint_every, progress=rank == 0)
    seeds: list[int] | D500Error = []
    if rank == 0:
        from d500.ledger import Ledger, iso
        progress.step("reading the ledger")
        try:
            job.ledger = Ledger()
            seeds = _seeds(job, args)
        except D500Error as err:
            seeds = err
    seeds = world.bcast(seeds, root=0)
    if isinstance(seeds, D500Error):
        raise seeds
    job.checkpoint_every = world.bcast(job.checkpoint_every, root=0)
    if not seeds:  # said before any rank loads the framework (torch: 4-9 s), as nothing runs
        starting.close()  # its line, not the spinner's
        if rank == 0:
            from d500.training.cli import done_line
            done_line(workload, args)
            if args.json:
                print("[]")
        return 0
    agreement.together(world, lambda: _loaded(args, workload, entry, size))
    progress.step("counting the idle cores")
    configure_threads(args)  # after the checks every rank agreed on; each rank its core share
    if rank == 0:
        job.group = f"mpi {iso(time.time())} {socket.gethostname()}:{os.getpid()}"
    results = []
    progress.step("starting the judges")
    job.starting = starting  # closed once the first run opens, before its bar
    waiting = judges(job, seeds)  # rank 0: every run's judge, before any entry code ran here
    if job.ledger is not None:  # no descriptor of the ledger left to the entry's code
        job.ledger.close()
    from d500.distributed import cover, guard
    cover.cover()  # every rank: $D500_HOME covered but for the entries' cache (the judges not)
    guard.install(world)  # every rank: its signals kept off the keepers (the judges unfiltered)
    try:
        for s in seeds:
            # the progress bar is the judge's (rank 0 ticks): no rank learns a held-out figure
            result = train_run(job, s, judge=waiting.pop(s) if rank == 0 else None)
            results.append((s, result))
            if rank == 0 and not args.json:
                from d500.training.cli import note
                from d500.training.console import print_whole
                print_whole(line(workload, s, result) + comm_line(result.figures)
                            + note(workload, entry, args.backend, s, size))
    finally:
        for judge in waiting.values():
            judge.close()
    if rank == 0 and args.json:
        from d500.training.cli import exploration
        print(json.dumps([{"seed": s, "run_id": r.run_id, "status": r.status,
                           "world_size": size,
                           "exploration": exploration(workload, entry, args.backend, s, size),
                           "figures": r.figures, "error": r.error}
                          for s, r in results], indent=1, default=str))
    from d500.training.cli import reached
    return reached(results)


def _seeds(job: Any, args: Any) -> list[int]:
    """Rank 0: the seeds this command runs, --checkpoint-every and --resume checked (level 2's
    checks, at this world size); a resumed run's seed alone, its Resumed kept in the job."""
    from d500.distributed.judge import hyperparameters
    from d500.training.cli import restarts
    size = job.comm.size
    checkpoints, job.resumed = restarts(job.ledger, job.workload, job.entry, args,
                                        hyperparameters=hyperparameters(job), world_size=size)
    job.checkpoint_every = checkpoints.every if checkpoints is not None else None
    if job.resumed is not None:
        from d500.distributed.resuming import fits  # each rank's piece from its grid place
        fits(job.spec, size, job.resumed)
        return [job.resumed.meta["seed"]]
    return choose_seeds(job.ledger, job.workload, job.entry, args, size)


def comm_line(f: dict[str, float]) -> str:
    """The communication figures of a run's line (rank 0)."""
    from d500 import metrics
    parts = [f"{name} {metrics.get(name).format(f[name])}"
             for name in ("bytes_per_step", "comm_share", "scaling_efficiency", "speedup")
             if name in f]
    return (", " + ", ".join(parts)) if parts else ""


class _AtWorld:
    """A ledger seen through one world size (seeds are per entry, workload, backend and N)."""

    def __init__(self, ledger: Any, size: int):
        self.ledger, self.size = ledger, size

    def runs(self, **kw: Any) -> list[dict[str, Any]]:
        return [r for r in self.ledger.runs(**kw) if (r["world_size"] or 1) == self.size]


def choose_seeds(ledger: Any, workload: Any, entry: Any, args: Any, size: int) -> list[int]:
    """level 2's seed rule (d500.training.cli.choose_seeds) among this world size's runs, the
    required seeds keyed by the world size too."""
    from d500.training.cli import choose_seeds as level2_seeds
    return level2_seeds(_AtWorld(ledger, size), workload, entry, args, size)
