"""One level-3 training run at N MPI ranks: every rank trains its share of each global batch through
the entry's scheme, and ONE ledger run is recorded, with the world size, the per-rank figures
and the MLLOG, by the judge: a process rank 0 spawns before the entry's code is built
(d500.distributed.judge).

    job = Job(comm, workload, entry, spec, "torch", ledger=Ledger() if rank 0 else None, ...)
    result = train(job, seed)          # on every rank; the same status everywhere

The level-2 rules hold unchanged, by the same code (d500.training.trainer._supervise, run by
the judge): the clock starts once every rank translated the model and built the scheme, before
any data is touched; the judge sends the training split alone to rank 0, which broadcasts it;
the stop rule reads validation accuracy only, measured by the judge on the model rank 0 hands
over from inside `scheme.evaluated()` (for a decentralised scheme, the average of the ranks'
models); test accuracy is measured after the run on the judge's copies of those models
(d500.training.heldout). The ranks train chunk by chunk (the steps up to the next evaluation or
the end of the epoch), so every rank leaves at the same step; a non-finite loss on any rank ends
the run `diverged`. Other ranks wait for rank 0 in sleeping collectives, not spinning ones.

Each rank times every `scheme.step` and reads the communicator's counters around it: bytes sent
and received, seconds inside collectives (communication) and the rest of the step (computation),
the `scheme.settle()` after each chunk of steps charged to them (what the steps left in flight);
evaluation traffic is kept apart. The judge gathers those (figures.RankStats) at the end, as the
ranks report them; every scored time is the judge's. The loop is loop.RankLoop; this module
starts the judge, builds, opens the run and guards it. Faults: faults.Watchdog (a rank that
dies, stops or fails alone ends the job; the judge records the run failed naming it).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

from d500.distributed.comm import Communicator
from d500.distributed.loop import RankLoop
from d500.distributed.resuming import Refused
from d500.distributed.spec import Spec
from d500.distributed.workloads import DistributedWorkload
from d500.errors import D500Error, describe
from d500.training.trainer import Result


@dataclasses.dataclass
class Job:
    """What every rank of one `d500 train` command shares (ledger and progress: rank 0 only)."""

    comm: Communicator
    workload: DistributedWorkload
    entry: Any  # d500.training.submission.Submission
    spec: Spec
    backend: str
    ledger: Any = None
    data_dir: str | None = None
    group: str = ""
    limit: float = 10.0  # watchdog: seconds of silence before a rank is given up
    checkpoint_every: int | None = None  # epochs between checkpoints (d500.training.resume)
    resumed: Any = None  # rank 0: the Resumed checkpoint this command's run continues
    progress: bool = False  # rank 0: its judges show a progress bar on stderr (rank 0 ticks)
    starting: Any = None  # rank 0's start-up steps (d500.progress), closed before a run's bar

    @property
    def global_batch(self) -> int:
        return self.workload.global_batch(self.entry.recipe.batch_size, self.comm.size)


def together(comm: Communicator, check: Callable[[], Any]) -> Any:
    """agreement.together over the run's ranks (one rank: just the check)."""
    if comm.mpi is None:
        return check()
    from d500.distributed.agreement import together as agree
    return agree(comm.mpi, check)


def build(job: Job, seed: int) -> tuple[Any, Any, Any]:
    """(trainer, scheme, reducer) of this rank: the model from `seed`, translated by the backend,
    its trainer and the entry's scheme (construction only: no communication yet)."""
    from d500 import backends
    from d500.backends.training_graph import running_statistics
    from d500.training.data import dataset as datasets
    wl, spec, comm = job.workload, job.spec, job.comm
    shape, classes = datasets.shape_of(wl.dataset)
    backend_cls = backends.get(job.backend)
    model = wl.build_model(seed, shape, classes)
    recipe = job.entry.recipe
    if spec.scheme == "pipelining":  # torch.distributed.pipelining on d500's cut (baseline)
        from d500.distributed.pipelining import build as pipelining
        return (*pipelining(model, spec, comm, backend_cls, recipe.optimizer(job.backend),
                            recipe.native, job.limit, job.global_batch), None)
    if spec.pipeline > 1:  # this rank translates its own stage only
        from d500.distributed.grid import Grid
        from d500.distributed.pipeline.scheme import build as pipeline
        scheme = pipeline(model, spec, Grid(comm, spec.dims(comm.size)), backend_cls,
                          recipe.optimizer(job.backend), recipe.native)
        return scheme.trainer, scheme, None
    if spec.scheme == "dtensor":  # torch DTensor's split of the same blocks (native baseline)
        from d500.distributed.dtensor import build as dtensor
        return (*dtensor(model, spec, comm, backend_cls, recipe.optimizer(job.backend),
                         recipe.native, job.limit), None)
    if spec.tensor > 1:  # this rank translates its own shard only
        from d500.distributed.grid import Grid
        from d500.distributed.tensor.scheme import build as tensor
        scheme = tensor(model, spec, Grid(comm, spec.dims(comm.size)), backend_cls,
                        recipe.optimizer(job.backend), recipe.native)
        return scheme.trainer, scheme, None
    if spec.shard == "zero3" and not running_statistics(model):  # layer by layer, no whole
        from d500.distributed.grid import Grid  # model translated
        from d500.distributed.schemes.zero3 import build as zero3
        scheme = zero3(model, spec, Grid(comm, spec.dims(comm.size)).data, backend_cls,
                       recipe.optimizer(job.backend), recipe.native)
        return scheme.trainer, scheme, None
    exe = backend_cls.prepare(model)
    trainer = exe.trainer(recipe.optimizer(job.backend), loss="loss", native=recipe.native)
    if spec.native:
        from d500.distributed.ddp import DDPScheme
        from d500.distributed.fsdp import FSDPScheme
        native = FSDPScheme if spec.scheme == "fsdp" else DDPScheme
        return trainer, native(trainer, comm, bucket_bytes=spec.bucket_bytes,
                               timeout=job.limit, **spec.options), None
    from d500.distributed import schemes
    from d500.distributed.grid import Grid
    # the scheme runs over the data dimension (the world while pipeline = tensor = 1: no split)
    data = Grid(comm, spec.dims(comm.size)).data
    reducer = None
    if spec.compressor != "none":
        reducer = schemes.make_reducer(data, spec.compressor, spec.compression, seed=seed,
                                       where=f"{spec.where}: field 'distributed.compression'")
    if spec.shard != "none":
        from d500.distributed.schemes.zero import Zero
        return trainer, Zero(trainer, data, stage=int(spec.shard[-1]),
                             bucket_bytes=spec.bucket_bytes, **spec.options), None
    scheme = schemes.make(spec.scheme, trainer, data, reducer=reducer,
                          bucket_bytes=spec.bucket_bytes, **spec.options)
    return trainer, scheme, reducer


def judges(job: Job, seeds: list[int]) -> dict[int, Any]:
    """Rank 0: a judge process per seed of a command, spawned before the entry's code runs in
    this process for its first run (the judge of a later run must not come from a process that
    ran it); other ranks: none."""
    if job.comm.rank != 0:
        return {}
    from d500.distributed.judge import Judge
    spawned = {s: Judge.spawn(job, s) for s in seeds}
    for judge in spawned.values():  # each shielded before any rank runs the entry's code
        judge.shielded()  # (train's barrier)
    return spawned


def train(job: Job, seed: int, judge: Any = None) -> Result:
    """One run on every rank; rank 0's judge process (`judges()`'s, or spawned here) records
    it. Bad input (a scheme option, an operator the backend lacks) raises on every rank before
    anything is recorded; a failure during the run ends the job (see the module docstring);
    divergence and a missed target are statuses."""
    comm = job.comm
    if comm.rank == 0 and judge is None:  # before build(): the entry's code not yet run here
        judge = judges(job, [seed])[seed]
    from d500 import progress
    if comm.mpi is not None:  # no rank builds (runs the entry's code) before the judges are
        comm.mpi.Barrier()  # shielded (judges())
    progress.step("starting each rank's worker")
    try:
        trainer, scheme, reducer = together(comm, lambda: build(job, seed))
    except BaseException:
        if judge is not None:
            judge.close()
        raise
    opened = None
    if judge is not None:  # rank 0's judge opens the run; a failure there reaches every rank
        try:
            opened = judge.open()
        except Exception as err:  # noqa: BLE001 - re-raised below, on every rank
            opened = err if isinstance(err, D500Error) else D500Error(describe(err))
    if comm.mpi is not None:
        opened = comm.mpi.bcast(opened, root=0)
    if isinstance(opened, BaseException):
        if judge is not None:
            judge.close()
        raise opened
    run_id = int(opened)
    if job.starting is not None:
        job.starting.close()  # the judge's bar shows the run from here
    try:
        return _relay(job, seed, trainer, scheme, reducer, judge, run_id)
    finally:
        if judge is not None:
            judge.close()


def _relay(job: Job, seed: int, trainer: Any, scheme: Any, reducer: Any, judge: Any,
           run_id: int) -> Result:
    """The ranks' side of the run, guarded: a rank that fails ends the job, and rank 0's judge
    records the run failed naming it."""
    comm = job.comm
    lost = judge.lost if judge is not None else (lambda why, gone=False, interrupted=False: None)
    watchdog = control = None
    if comm.mpi is not None:  # the run's own decisions never share the scheme's communicator
        from d500.distributed.faults import Watchdog
        control = comm.mpi.Dup()
        watchdog = Watchdog(comm.mpi, job.limit, on_lost=lost)
    from d500.distributed.contention import Mark
    mark = Mark.now()  # this rank's CPU time from here (the judge measures the machine's)
    try:
        with watchdog if watchdog is not None else contextlib.nullcontext():
            status, error, figures = RankLoop(job, seed, trainer, scheme, reducer, judge,
                                              job.progress, control, mark).run()
    except KeyboardInterrupt:  # Ctrl-C: recorded interrupted (resumable), as level 2 records it
        lost("interrupted (Ctrl-C)", interrupted=True)
        raise
    except Refused:  # the judge refused the run, every rank told at once: they end together
        if control is not None:
            watchdog.close()
            control.Free()
        raise
    except Exception as err:  # the run fails on this rank: end the job
        text = describe(err)
        if watchdog is None:
            lost(text)
            return Result(run_id, "failed", error=text)
        if comm.rank == 0:
            dead = watchdog.peer_gone()  # (gloo's reset by a killed peer, seen first here)
            if dead:
                lost(f"{dead}; rank 0 then failed: {text}", True)
                watchdog.abort(dead)
            lost(f"rank 0 failed: {text}")
            watchdog.abort(f"rank 0 failed: {text}")
        watchdog.fail(text)
        raise  # not reached: fail() ends the job
    if control is not None:
        watchdog.close()
        control.Free()
    return Result(run_id, status, figures if comm.rank == 0 else {}, error)
