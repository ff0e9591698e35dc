"""The SQLite ledger: every run of every level, its provenance, evaluations, artifacts and hashes.

    from d500.ledger import Ledger
    ledger = Ledger()                       # $D500_HOME/ledger.sqlite, created on first use
    with ledger.start_run(level=0, workload="conv-3x3", submission="numpy-im2col-conv",
                          backend="numpy", seed=0, hyperparameters={...},
                          workload_file=path_or_None, submission_files=[paths],
                          model_file=path_or_None,
                          group=None, rank=None, world_size=None, parent=None,
                          begin=True) as run:      # begin=False: init until run.begin()
        run.mllog.event("eval_accuracy", 0.93, metadata={"epoch_num": 3})  # MLLOG event
        run.evaluation(step=100, epoch=1, metrics={"val_accuracy": 0.9})   # time series
        run.artifact(path)                                                 # sha256 stored
        run.record(figures={"latency": 1.2e-3, ...}, details={...})        # metric name -> value
    # leaving the block: succeeded; an exception: failed (Diverged -> diverged,
    # KeyboardInterrupt -> interrupted, TimeoutError -> timeout) and the exception propagates.
    run.finish(status, figures=None, details=None, error=None) ends a run explicitly; a status
    is one of STATUSES (`missed`: a training budget spent before its target).

    ledger.runs(level=None, workload=None, status=None, submission=None, backend=None,
                group=None) -> list[dict]   # id, level, workload, submission, backend, status,
        # seed, started, stopped, figures, details, study (its id), study_number (from 0 in
        # its tuning), trial, group, rank, world_size,
        # parent, ... (a dead writer's `running` row shows as `interrupted`)
    ledger.get(run_id) -> dict              # the same plus evaluations, artifacts, provenance
    ledger.start_study(...) -> Study; study.trial(params, ...) -> Run (trial N of the study);
    ledger.studies(), ledger.trials(study_id)
    ledger.import_run(record) -> int        # a run a Relay recorded elsewhere (d500.ledger.relay)
    ledger.import_package(path, force=False, rules_dir=None) -> Imported   # a competitor's
        # package (d500.ledger.imports); run dicts of its runs carry "package": {"id",
        # "entry", "sha256", "forced"} (None for this ledger's own), get() adds "origin"
    ledger.packages() -> list[dict]         # the packages imported
    ledger.verify(rehash=True) -> list[str]                       # problems; empty when intact
    ledger.verify_runs(rehash=False) -> ({run_id: [problems]}, [problems not tied to a run])

Figures are keyed by metric names defined in metrics/; an unknown name is a D500Error. A run has
`id`, `dir` (home/runs/<id>/, where mllog.txt lives) and `elapsed()` (seconds since run_start,
for time-to-accuracy).

The package, one job per module: store (the file, WAL, transactions, paths), migrations (the
numbered schema), start (a run's fields checked and read once, and start_run, for the Ledger
and the Relay alike), lifecycle (runs, studies, trials: insert, record, finish, reap), liveness
(whether a row's writer still runs), integrity (sealing, the hash chain, verification and its
digest cache), core (the Ledger object and its queries), relay (runs recorded in a process
without the ledger, imported by the one that has it), imports (competitors' packages merged in)
and origins (verifying imported runs against the chain they came from). MLLOG lines are
written by d500.mllog.
"""

from __future__ import annotations

from d500.ledger.core import Ledger
from d500.ledger.integrity import GENESIS, SEALED, SEALED_IF_SET, sha256_file
from d500.ledger.lifecycle import FINAL, STATUSES, Run, Study, iso
from d500.ledger.liveness import process_alive, process_identity
from d500.ledger.migrations import SCHEMA_VERSION


def finite(value: object) -> bool:
    """Whether a value is a real number: an int or float (not a bool), neither NaN nor infinite
    nor an int too large for a float (None, strings and anything else are not)."""
    import math

    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


__all__ = ["FINAL", "GENESIS", "SCHEMA_VERSION", "SEALED", "SEALED_IF_SET", "STATUSES", "Ledger",
           "Run", "Study", "finite", "iso", "process_alive", "process_identity", "sha256_file"]
