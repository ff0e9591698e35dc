"""What d500 knows about JAX without importing it: its packages, threads and hooks."""

from __future__ import annotations

import os
import sys
from importlib import import_module
from typing import Any

from d500.backends.hooks import Framework
from d500.errors import UsageError
from d500.threads import few_cores


class Jax(Framework):
    """XLA's CPU pool, sized once when JAX's client starts."""

    def set_threads(self, n: int) -> None:
        """Start JAX's CPU client with an intra-op pool of n threads. jaxlib 0.10.2's XLA sizes
        that pool (its "XLAEigen" threads, which run every op's parallel work) from the
        environment variable NPROC when the client starts (XLA's DefaultThreadPoolSize), else
        from the usable cores; XLA_FLAGS' `intra_op_parallelism_threads=1` and
        `--xla_cpu_multi_thread_eigen=false` change nothing there (measured: CPU/wall time 1.75
        with them on this 2-core machine, 0.98 with NPROC=1). So NPROC is n while the client
        starts, and put back after: child processes choose their own. A count given after the
        client started with another raises a UsageError, as TensorFlow's does.

        Two more of XLA's threads work beside the caller's, runnable on a loaded machine while it
        waits for them (d500.training.cpu judges a worker's runnable time): the client's compile
        pool, one thread per core its compiling thread may use (tsl's MaxParallelism: that
        thread's CPU affinity; no flag sizes it), which compiled the digits-mlp step on 2
        threads at --threads 1 on 2 cores; and async dispatch, which runs each computation on
        a client thread while the caller waits for its result. So the client starts with async
        dispatch off (each computation on the caller's thread: d500's steps wait for their loss
        anyway) and, with a first compile, on n of the usable cores (d500.threads.few_cores):
        its compile pool has n threads."""
        now = self.threads()
        if now is not None:
            if now != n:
                raise UsageError(
                    f"JAX already runs with {now} XLA threads in this process and cannot change "
                    f"to {n}: the thread count must be set before JAX computes anything (give "
                    f"--threads to a new d500 process)")
            return
        saved = os.environ.get("NPROC")
        os.environ["NPROC"] = str(n)
        try:
            jax = import_module("jax")
            jax.config.update("jax_cpu_enable_async_dispatch", False)
            with few_cores(n):
                jax.devices()  # the client (and its pools) starts here
                jax.jit(lambda v: v + 1.0)(1.0).block_until_ready()  # and its compile pool
        finally:
            if saved is None:
                del os.environ["NPROC"]
            else:
                os.environ["NPROC"] = saved

    def threads(self) -> Any:
        """How many threads XLA's CPU pool has in this process (its threads are named
        "XLAEigen"), read from /proc/self/task; None before JAX's client started (or off
        Linux)."""
        if "jax" not in sys.modules or not os.path.isdir("/proc/self/task"):
            return None
        count = 0
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/comm", encoding="utf-8") as f:
                    count += "XLAEigen" in f.read()
            except OSError:
                continue  # a thread that ended meanwhile
        return count or None


FRAMEWORK = Jax(
    "jax", module="jax", distribution="jax", packages=("jaxlib", "optax"), aliases=("optax",),
    optimizer_ops="d500.backends.jax.optimizer_ops",
    native_optimizers="d500.backends.jax.native_optimizers:NATIVE",
    backward="d500.backends.jax.operators:backward",
    operator_runner="d500.backends.jax.operators:JaxRunner", autograd=True,
    threads_when_loaded=False,  # XLA's pool is sized when JAX first computes: only when asked
    about=("jit: the whole translated graph as one jax.jit function (one per baked input value); "
           "training: one jitted step over jax.value_and_grad"),
    modes={"eager": "eager: the same functions op by op, no jax.jit (each op dispatched as it is "
                    "called: inference, gradients and the training step)"})
