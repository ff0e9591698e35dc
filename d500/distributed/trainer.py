"""One level-3 training run at N MPI ranks: every rank trains its share of each global batch through
the entry's scheme; rank 0 evaluates, decides when to stop (its decision broadcast), and records
ONE ledger run with the world size, the per-rank figures gathered to it, and the MLLOG.

    job = Job(comm, workload, entry, spec, "torch", ledger=Ledger() if rank 0 else None, ...)
    result = train(job, seed)          # on every rank; the same status everywhere

The level-2 rules hold unchanged (d500.training.trainer): the clock starts (on every rank, after
a barrier) once the model is translated and the scheme built, before any data is touched; the
stop rule reads validation accuracy only, measured by rank 0 inside `scheme.evaluated()` (for a
decentralised scheme, the average of the ranks' models); test accuracy is taken with the clock
paused. Stop decisions (target met, budget spent, a non-finite loss on any rank: `diverged`) are
made at evaluations and at the end of every epoch, so every rank leaves the loop at the same
step. Other ranks wait for rank 0's evaluation in a sleeping barrier, not a spinning one.

Each rank times every `scheme.step` and reads the communicator's counters around it: bytes sent
and received, seconds inside collectives (communication) and the rest of the step (computation);
evaluation traffic is kept apart. Rank 0 gathers those (figures.RankStats) at the end. The loop
itself is loop.RankLoop; this module opens the run, guards it and records it. Faults:
faults.Watchdog (a rank that dies, stops or fails alone ends the job; the run recorded failed
naming it when rank 0 lives to record it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import socket
from collections.abc import Callable
from typing import Any

from d500.distributed import figures as figs
from d500.distributed.comm import Communicator
from d500.distributed.loop import RankLoop
from d500.distributed.spec import Spec
from d500.distributed.workloads import DistributedWorkload
from d500.errors import D500Error, describe
from d500.training.trainer import Progress, Result, missed_figures


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
    from d500.training.data import dataset as datasets
    wl, spec, comm = job.workload, job.spec, job.comm
    shape, classes = datasets.shape_of(wl.dataset["name"])
    backend_cls = backends.get(job.backend)
    exe = backend_cls.prepare(wl.build_model(seed, shape, classes))
    recipe = job.entry.recipe
    trainer = exe.trainer(recipe.optimizer(job.backend), loss="loss", native=recipe.native)
    if spec.native:
        from d500.distributed.ddp import DDPScheme
        return trainer, DDPScheme(trainer, comm, bucket_bytes=spec.bucket_bytes,
                                  timeout=job.limit, **spec.options), None
    from d500.distributed import schemes
    reducer = None
    if spec.compressor != "none":
        reducer = schemes.make_reducer(comm, spec.compressor, spec.compression, seed=seed,
                                       where=f"{spec.where}: field 'distributed.compression'")
    scheme = schemes.make(spec.scheme, trainer, comm, reducer=reducer,
                          bucket_bytes=spec.bucket_bytes, **spec.options)
    return trainer, scheme, reducer


def train(job: Job, seed: int, progress: Progress | None = None) -> Result:
    """One run on every rank; rank 0 records it. Bad input (a scheme option, an operator the
    backend lacks) raises on every rank before anything is recorded; a failure during the run
    ends the job (see the module docstring); divergence and a missed target are statuses."""
    comm, wl = job.comm, job.workload
    trainer, scheme, reducer = together(comm, lambda: build(job, seed))
    run, opened = None, None
    if comm.rank == 0:  # rank 0 opens the run; a failure there reaches every rank
        try:
            run = _open(job, seed)
            opened = run.id
        except Exception as err:  # noqa: BLE001 - re-raised below, on every rank
            opened = err if isinstance(err, D500Error) else D500Error(describe(err))
    if comm.mpi is not None:
        opened = comm.mpi.bcast(opened, root=0)
    if isinstance(opened, BaseException):
        raise opened
    run_id = int(opened)
    details = {"target": wl.target, "target_metric": wl.target_metric,
               "world_size": comm.size, "global_batch": job.global_batch,
               "batch_mode": wl.batch_mode, "scheme": job.spec.scheme,
               "compressor": job.spec.compressor}
    watchdog = control = None
    if comm.mpi is not None:  # the run's own decisions never share the scheme's communicator
        from d500.distributed.faults import Watchdog
        control = comm.mpi.Dup()
        watchdog = Watchdog(comm.mpi, job.limit,
                            on_lost=lambda why: _lost(run, wl, details, why))
    from d500.distributed.contention import Mark
    from d500.provenance import LoadWatch
    watch = LoadWatch()  # how busy the machine was (the other ranks of this job aside)
    mark = Mark.now()  # ... and, exactly, how much CPU other processes took during the run
    try:
        with watchdog if watchdog is not None else contextlib.nullcontext():
            outcome = RankLoop(job, seed, trainer, scheme, reducer, run, progress,
                               control, mark).run()
    except Exception as err:  # the run fails on this rank: end the job
        text = describe(err)
        if watchdog is None:
            _lost(run, wl, details, text)
            return Result(run_id, "failed", error=text)
        if comm.rank == 0:
            _lost(run, wl, details, f"rank 0 failed: {text}")
            watchdog.abort(f"rank 0 failed: {text}")
        watchdog.fail(text)
        raise  # not reached: fail() ends the job
    status, error, figures, ranks = outcome
    if control is not None:  # rank 0 alone knows whether the target was met
        status, error = control.bcast((status, error), root=0)
        watchdog.close()
        control.Free()
    if run is not None:
        figures.update(figs.scaling(job.ledger, run.id, wl, job.entry.name, job.backend,
                                    comm.size, figures.get("time_to_accuracy", math.inf)))
        here = socket.gethostname()
        details.update(ranks=figs.details(ranks), oversubscribed=_oversubscribed(ranks),
                       load_average=_load(watch, ranks),
                       contention=mark.others(sum(r.cpu_seconds for r in ranks
                                                  if r.host == here)),
                       scheme_figures=ranks[0].scheme if ranks else {},
                       scheme_details=ranks[0].scheme_details if ranks else {})
        run.finish(status, figures=figures, error=error or None, details=details)
    return Result(run_id, status, figures if comm.rank == 0 else {}, error)


def _open(job: Job, seed: int) -> Any:
    wl, entry, spec, comm = job.workload, job.entry, job.spec, job.comm
    hyper = {**entry.recipe.hyperparameters_logged(), "batch_size": job.global_batch,
             "per_rank_batch_size": math.ceil(job.global_batch / comm.size),
             **spec.logged()}
    return job.ledger.start_run(level=wl.level, workload=wl.name, submission=entry.name,
                                backend=job.backend, seed=seed, hyperparameters=hyper,
                                workload_file=wl.path, submission_files=list(entry.files),
                                group=job.group or None, rank=0, world_size=comm.size,
                                begin=False)


def _lost(run: Any, wl: DistributedWorkload, details: dict[str, Any], why: str) -> None:
    """Rank 0 records the run failed (from the watchdog thread when another rank was lost)."""
    if run is not None:
        run.finish("failed", figures=missed_figures(wl), error=why, details=details)


def _oversubscribed(ranks: list[figs.RankStats]) -> bool:
    """Whether some host ran more ranks than it has cores (say so beside the figures)."""
    per_host: dict[str, int] = {}
    for r in ranks:
        per_host[r.host] = per_host.get(r.host, 0) + 1
    from d500.provenance import usable_cores
    return per_host.get(socket.gethostname(), 0) > usable_cores()


def _load(watch: Any, ranks: list[figs.RankStats]) -> dict[str, Any]:
    """LoadWatch's record with this job's other ranks on this host taken out of the others'
    load (each keeps a core busy, computing or polling)."""
    from d500.provenance import LOADED_SHARE
    out = watch.finish()
    here = sum(1 for r in ranks if r.host == socket.gethostname()) - 1
    others = [None if v is None else round(max(0.0, v - here), 2) for v in out["others"]]
    known = [v for v in others if v is not None]
    out.update(others=others, job_ranks_here=here + 1,
               loaded=bool(known) and max(known) > LOADED_SHARE * out["usable_cores"])
    return out
