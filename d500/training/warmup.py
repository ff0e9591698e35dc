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

