"""What d500 knows about TensorFlow without importing it: its packages, threads and hooks."""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from d500.backends.hooks import Framework
from d500.errors import UsageError

# What Keras (which `import tensorflow` loads) imports whenever it is installed, for what d500
# never asks of it (scikit-learn wrappers, pandas inputs, pyplot galleries): ~3.5 s of CPU, a third
# of the import, in every process that imports TensorFlow (each level-2 worker, each test worker).
KERAS_EXTRAS = ("sklearn", "pandas", "matplotlib")


def import_tensorflow() -> ModuleType:
    """TensorFlow, imported quietly (`import_quietly`, which hides KERAS_EXTRAS while it loads:
    FRAMEWORK's `hidden`)."""
    from d500.backends import import_quietly
    return import_quietly("tensorflow")


_xla_started: list[bool] = []  # start_xla ran in this process


def start_xla() -> None:
    """Start TensorFlow's XLA CPU compiler (once per process, before tensorflow:xla compiles)
    on the recorded thread count's cores (d500.threads.few_cores): its compile pool then has
    that many threads (on every core after). Started by the first jit_compile'd function on a
    thread free to use every core, it compiled on one per core, runnable beside the caller (2
    on 2 cores at --threads 1: honest digits-mlp runs read 1.58-1.70x their recorded thread,
    the worker's judge d500.training.cpu); a tiny function compiled here starts it."""
    if _xla_started:
        return
    _xla_started.append(True)
    from d500 import threads
    tf = import_tensorflow()
    recorded = threads.recorded()  # none set: every usable core, TensorFlow's own
    with threads.few_cores(recorded["count"] if recorded else 10**6), tf.device("/CPU:0"):
        tf.function(lambda v: v + 1.0, jit_compile=True, autograph=False)(tf.constant(1.0))


class TensorFlow(Framework):
    """TensorFlow's intra- and inter-op pools, fixed when its runtime starts."""

    def set_threads(self, n: int) -> None:
        """Set both pools before TensorFlow runs anything; if it already ran with another count,
        the count cannot change in this process: a UsageError saying so (TensorFlow's own
        default, one thread per usable core, counts as that count)."""
        from d500 import provenance
        threading = import_tensorflow().config.threading
        for what, get, set_ in (
                ("intra-op", threading.get_intra_op_parallelism_threads,
                 threading.set_intra_op_parallelism_threads),
                ("inter-op", threading.get_inter_op_parallelism_threads,
                 threading.set_inter_op_parallelism_threads)):
            if get() == n or (get() == 0 and n == provenance.usable_cores()):
                continue  # 0: TensorFlow's own choice, one thread per usable core
            try:
                set_(n)
            except RuntimeError:
                now = get() or "its default"
                raise UsageError(
                    f"TensorFlow already runs with {now} {what} threads in this process and "
                    f"cannot change to {n}: the thread count must be set before TensorFlow runs "
                    f"anything (give --threads to a new d500 process)") from None

    def threads(self) -> Any:
        threading = sys.modules["tensorflow"].config.threading
        return {"intra": threading.get_intra_op_parallelism_threads(),
                "inter": threading.get_inter_op_parallelism_threads()}


FRAMEWORK = TensorFlow(
    "tensorflow", module="tensorflow", distribution="tensorflow-cpu",
    packages=("tensorflow",), aliases=("keras",),
    optimizer_ops="d500.backends.tensorflow.optimizer_ops",
    native_optimizers="d500.backends.tensorflow.native_optimizers:NATIVE",
    backward="d500.backends.tensorflow.operators:backward",
    operator_runner="d500.backends.tensorflow.operators:TensorFlowRunner", autograd=True,
    tie_rank=3, hidden=KERAS_EXTRAS,
    about="graph: the translated model as a tf.function (traced once per input signature)",
    modes={"xla": "XLA: the same tf.functions compiled with jit_compile=True (inference, "
                  "gradients and the training step)"})
