"""A fresh process's first steps taken before the clock: one training step of a throw-away copy
of the model on zeros in the worker, one evaluation batch of zeros in the judge.

The entry's code trains in a worker process new for every run (d500.training.worker), so its
first steps meet cold kernels, allocator pools and code paths, where the loop before the split
trained a command's later seeds in a process that had trained already: on an idle 16-core
machine, digits-mlp's time to accuracy was 1.27x with workers against that warm loop
(benchmarks/isolation.py --warm, before this warm-up). The judge's own copy of the model had
likewise never run when it met its first evaluation. Both warm-ups run d500's code on zeros
only: no data reaches the worker before the clock, the model and optimizer that train are not
the ones stepped, and the RNG states are put back, so the run is the run it was. A mode that
traces or compiles its step (tensorflow, jax, torch:compiled: Backend.traces_step) is not
warmed: that work counts in time to accuracy (d500.training.compiling).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper

ROWS = 8  # the judge's evaluation batch of zeros: its code paths, not every shape's kernels
# The worker's warm-up (its copy of the model translated, one step on zeros) may take FACTOR x
# what the judge took to translate its own copy and run ROWS rows of zeros forward, scaled by the
# batch's rows over ROWS (a step is ~3 forwards: ~7x to spare), and at least FLOOR s (a first
# step's one-time costs, a loaded machine), but never more than the workload's whole time budget
# (a step longer than that trains nothing in it): an optimizer that hung there was waited on for
# the worker's whole start-up allowance (d500.training.worker.START, 600 s)
FACTOR = 20.0
FLOOR = 30.0


def zeros(model: onnx.ModelProto, rows: int) -> dict[str, np.ndarray]:
    """Zeros for every graph input that is not an initializer, `rows` in its first dimension
    when that is not fixed (its other dimensions are the model's)."""
    fixed = {t.name for t in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name in fixed:
            continue
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (rows if i == 0 else 1)
                for i, d in enumerate(tensor.shape.dim)]
        feeds[value.name] = np.zeros(dims, helper.tensor_dtype_to_np_dtype(tensor.elem_type))
    return feeds


def bound(judge_seconds: float, batch: int, max_seconds: float) -> tuple[float, str]:
    """Seconds the worker's warm-up may take, and why that many (for the error line)."""
    measured = FACTOR * judge_seconds * max(1.0, batch / ROWS)
    if max_seconds <= max(measured, FLOOR):
        return max_seconds, "the workload's whole time budget, max_seconds"
    if measured <= FLOOR:
        return FLOOR, "its floor"
    return measured, (f"{FACTOR:g}x the {judge_seconds:.3g} s the judge took to build its copy "
                      f"and run {ROWS} rows forward, x {batch}/{ROWS} rows")


def train_step(job: Any, backend_cls: Any, model: onnx.ModelProto) -> None:
    """One step, at the schedule's first learning rate, of a copy of the job's model and
    optimizer on a batch of zeros; every RNG state as it was before."""
    if backend_cls.traces_step():
        return
    from d500.training import checkpoint
    arrays, header = checkpoint.rng_state()
    try:
        trainer = backend_cls.prepare(model).trainer(
            job.recipe.optimizer(backend_cls.name), loss="loss", native=job.recipe.native,
            precision=job.recipe.precision)
        trainer.step(zeros(model, job.recipe.batch_size), job.recipe.schedule(1)(0))
    finally:
        checkpoint.set_rng_state(arrays, header)

