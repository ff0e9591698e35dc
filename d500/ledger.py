"""The SQLite ledger: every run of every level, its provenance, evaluations, artifacts and hashes.

INTERFACE (agreed between the levels; the implementation fills it in):

    from d500.ledger import Ledger
    ledger = Ledger()                       # $D500_HOME/ledger.sqlite, created on first use
    with ledger.start_run(level=0, workload="conv-3x3", submission="numpy-im2col-conv",
                          backend="numpy", seed=0, hyperparameters={...},
                          workload_file=path_or_None, submission_files=[paths],
                          model_file=path_or_None) as run:
        run.mllog.event("eval_accuracy", 0.93, metadata={"epoch_num": 3})  # MLLOG event
        run.evaluation(step=100, epoch=1, metrics={"val_accuracy": 0.9})   # time series
        run.artifact(path)                                                 # sha256 stored
        run.record(figures={"latency": 1.2e-3, ...}, details={...})        # metric name -> value
    # leaving the block: succeeded; an exception: failed (Diverged -> diverged,
    # KeyboardInterrupt -> interrupted) and the exception propagates.
    run.finish(status, figures=None, details=None, error=None) ends a run explicitly.

    ledger.runs(level=None, workload=None, status=None) -> list[dict]   # each with id, level,
        workload, submission, backend, status, seed, started, stopped, figures, details, ...
    ledger.get(run_id) -> dict
    ledger.verify() -> list[str]            # problems found; empty when intact

Figures are keyed by metric names defined in metrics/; an unknown name is a D500Error.
"""

from __future__ import annotations
