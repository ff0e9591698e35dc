"""The level-2 job the worker benchmarks start: digits-mlp, sgd-momentum's recipe, torch, one
thread, seed 0 (worker_start.py, worker_churn.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def digits_job() -> tuple[Any, Any, Any]:
    """(workload, recipe, d500.training.worker.Job) of a digits-mlp run on torch at 1 thread."""
    from d500 import threads
    from d500.training import submission, trainer, workloads
    from d500.training.worker import Job
    threads.configure(1, ["torch"])
    workload = workloads.load(ROOT / "levels" / "2-training" / "digits-mlp.yaml")
    recipe = submission.load(ROOT / "submissions" / "sgd-momentum").recipe
    _, model = trainer.ready(workload, recipe, "torch", None, 0)
    job = Job(model.SerializeToString(), "torch", recipe, 0, threads.recorded(),
              workload.drop_last)
    return workload, recipe, job
