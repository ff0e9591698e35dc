"""One reproduction run in its own process: `python -m d500.competition.reproduce_job JOB.json`
(a level-2 run, a level-0 validation or a level-1 run), or the same under `mpiexec -n N` (a
level-3 run, every rank). The run goes through the real trainers (d500.training.trainer.train;
d500.distributed.trainer.train; level 0: d500.operators.run.validate_cases; level 1: net check,
its bench without timing, the conformance suite: d500.competition.reproduce_level1) with
the origin's seed, recipe, backend and thread count, into the ledger the job names, each new
run stamped with the job's `details` from its start. Rank 0 (or the one process) writes
{"run_id", "status", "figures", "error", "threads"} to the job's `out` file.

The job file (written by d500.competition.reproduce):
    {"level": 2, "ledger": PATH, "workload": PATH | null, "submission": DIR, "backend": "torch",
     "case": NAME, "seed": 0, "params": {recipe_with parameters, level 0's recorded settings,
     or level 1's (d500.competition.reproduce_level1.prepare)}, "threads": 2 | null,
     "details": {...}, "data": DIR | null, "group": "...", "out": PATH,
     "split_seed": S | null (levels 2 and 3: the dataset split under that seed)}

A separate process per run gives each its own thread count (TensorFlow cannot change its pools
once it ran) and keeps one run's framework state out of the next.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from d500.errors import D500Error


class Stamped:
    """A ledger whose new runs carry `details` from the moment they open (the trainers' own
    details are merged over them when the run finishes); everything else is the ledger's."""

    def __init__(self, ledger: Any, details: dict[str, Any]):
        self._ledger, self.stamp = ledger, details  # (level 3's judge re-opens it from these)

    def start_run(self, *args: Any, **kwargs: Any) -> Any:
        run = self._ledger.start_run(*args, **kwargs)
        run.record(details=self.stamp)
        return run

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)


def load(job: dict[str, Any]) -> tuple[Any, Any]:
    """The workload and the entry with the run's recipe put in."""
    import dataclasses

    from d500 import levels
    from d500.training import submission

    path = Path(job["workload"])
    workload = levels.of_file(path).load(path)
    if job.get("split_seed") is not None:  # d500 reproduce --split-seed: a split never seen
        workload.dataset = {**workload.dataset, "split_seed": int(job["split_seed"])}
    entry = submission.load(job["submission"])
    return workload, dataclasses.replace(entry, recipe=entry.recipe_with(job["params"]))


def level2(job: dict[str, Any]) -> dict[str, Any]:
    """One run in this process, through the level-2 trainer."""
    from d500 import backends, threads
    from d500.ledger import Ledger
    from d500.training.trainer import train

    fw = backends.framework(job["backend"])
    if job["threads"] is not None:
        threads.configure(int(job["threads"]), [fw[0]] if fw else [])
    workload, entry = load(job)
    ledger = Stamped(Ledger(job["ledger"]), job["details"])
    result = train(workload, entry.recipe, job["backend"], int(job["seed"]), ledger=ledger,
                   data_dir=job["data"], submission=entry.name, submission_files=entry.files)
    return {"run_id": result.run_id, "status": result.status, "figures": result.figures,
            "error": result.error, "threads": threads.actual()}


def level3(job: dict[str, Any]) -> dict[str, Any] | None:
    """One run at this process's world size, through the level-3 trainer (every rank; rank 0
    returns the result, the others None). Checks fail on every rank alike."""
    from d500.distributed import faults
    faults.ignore_launcher_notices()  # hydra's notice of a rank's exit must not end this one
    from mpi4py import MPI

    from d500 import backends, threads
    from d500.distributed import spec as specs
    from d500.distributed.agreement import together
    from d500.distributed.comm import Communicator
    from d500.distributed.trainer import Job
    from d500.distributed.trainer import train as train_run
    from d500.ledger import Ledger
    from d500.training.trainer import preflight

    world = MPI.COMM_WORLD
    size = world.Get_size()
    # the origin's count on every rank, recorded in the run's provenance as `d500 train` under
    # mpiexec records it (else each rank's share of the host's cores)
    from d500.distributed.launch import core_share
    fw = backends.framework(job["backend"])
    threads.configure(None if job["threads"] is None else int(job["threads"]),
                      [fw[0]] if fw else [], fallback=core_share())

    def checked() -> tuple[Any, Any, Any]:
        workload, entry = load(job)
        spec = specs.parse(entry.distributed, entry.path)
        workload.check_world(size)
        workload.check_batch(entry.recipe.batch_size, size, str(entry.path))
        import dataclasses
        preflight(workload, dataclasses.replace(entry.recipe, batch_size=workload.global_batch(
            entry.recipe.batch_size, size)), job["backend"], job["data"])
        backends.get(job["backend"])
        return workload, entry, spec

    workload, entry, spec = together(world, checked)
    rank = world.Get_rank()
    ledger = Stamped(Ledger(job["ledger"]), job["details"]) if rank == 0 else None
    run_job = Job(Communicator(world if size > 1 else None), workload, entry, spec,
                  job["backend"], ledger=ledger, data_dir=job["data"], group=job["group"],
                  limit=faults.limit())
    result = train_run(run_job, int(job["seed"]))
    if rank != 0:
        return None
    return {"run_id": result.run_id, "status": result.status, "figures": result.figures,
            "error": result.error, "threads": threads.actual()}


def main(argv: list[str]) -> int:
    from d500.distributed.launch import launched_by_mpi, share_cores
    if len(argv) != 1:
        print("usage: python -m d500.competition.reproduce_job JOB.json", file=sys.stderr)
        return 2
    try:
        job = json.loads(Path(argv[0]).read_text())
        if job["level"] in (0, 1):
            from d500.competition import reproduce_level0, reproduce_level1
            from d500.ledger import Ledger
            found = (reproduce_level0 if job["level"] == 0 else reproduce_level1).run(
                job, Stamped(Ledger(job["ledger"]), job["details"]))
        elif job["level"] == 3:
            if not launched_by_mpi():
                raise D500Error("a level-3 reproduction runs under mpiexec")
            share_cores()  # before a framework is imported (the job's OMP_NUM_THREADS wins)
            found = level3(job)
        else:
            found = level2(job)
    except D500Error as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return err.exit_code
    if found is not None:
        Path(job["out"]).write_text(json.dumps(found, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
