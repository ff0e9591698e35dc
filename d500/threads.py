"""One intra-op thread count for every framework d500 times (torch, TensorFlow's intra- and inter-op
pools, onnxruntime's sessions, OpenVINO's compiled models, JAX's XLA CPU pool, NumPy's BLAS), set
once per process: comparisons are fair only then.

    from d500 import threads
    threads.configure(4, threads.frameworks(["torch", "tensorflow"]))  # before anything runs
    threads.recorded()  # {"count": 4, "set_by": "--threads"}: part of every run's provenance
    threads.actual()    # what each loaded framework reports now

The default is the number of cores idle when the run starts: the cores this process may use
(`os.sched_getaffinity`) less what other processes take then (d500.provenance.others_now, read
once per process over IDLE_WINDOW s), rounded, at least 1: on a machine others keep busy, more
threads than idle cores only contend with them. A caller may give another default with its
reason (`d500 train`/`d500 tune` under MPI: each rank's share of its host's cores,
d500.distributed.launch.core_share). TensorFlow
fixes its pools when its runtime starts, so configure() sets them before TensorFlow runs
anything; if it already ran with another count, the count cannot change in this process and
configure() raises a UsageError saying so (TensorFlow's own default, one thread per usable core,
counts as the default count). The count is set through each framework's API, not
the environment: child processes (MPI ranks sharing the cores, d500.distributed.launch) keep
choosing their own. XLA has no such API: its CPU client sizes its intra-op pool
once, when JAX first computes (d500/backends/jax/framework.py); a count given after that raises a
UsageError, as TensorFlow's does. Each framework's part lives in its FRAMEWORK's thread hooks
(d500.backends.hooks).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from d500.errors import UsageError

DEFAULT_WHY = "default: the cores idle when the run started"
USABLE_WHY = "default: the cores this process may use"
IDLE_WINDOW = 0.25  # seconds over which default() reads what other processes take
_setting: dict[str, Any] | None = None
_idle: int | None = None  # default(), once measured
_blas_limits: Any = None  # threadpoolctl's limiter, kept for the life of the process


def default() -> int:
    """The count used without --threads: the cores idle when the run starts (the usable cores
    less what other processes take, rounded; at least 1), measured once per process; the usable
    cores where the machine does not say (no /proc/stat)."""
    global _idle
    if _idle is None:
        from d500 import provenance
        cores, others = provenance.usable_cores(), provenance.others_now(IDLE_WINDOW)
        _idle = cores if others is None else max(1, min(cores, round(cores - others)))
    return _idle


OVERSUBSCRIBED = 4  # --threads at most this many times the usable cores: more is a typo


def parse(text: str) -> int:
    """argparse type of `--threads N`: an integer >= 1, at most OVERSUBSCRIBED x the usable
    cores (5000 on 2 cores ran and recorded a run at 26 samples/s; 10**20 overflowed torch)."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a number of threads >= 1, got {text!r}")
    from d500 import provenance
    cores = provenance.usable_cores()
    if int(text) > OVERSUBSCRIBED * cores:
        raise argparse.ArgumentTypeError(
            f"expected at most {OVERSUBSCRIBED * cores} threads ({OVERSUBSCRIBED}x the {cores} "
            f"cores this process may use), got {text!r}")
    return int(text)


def add_option(parser: argparse.ArgumentParser, mpi: bool = False) -> None:
    """`--threads N`, as `op bench`, `net bench`, `run`, `train` and `tune` take it (`mpi`: the
    command may run as MPI ranks, which share a host's cores by default)."""
    from d500 import provenance
    shared = "; under mpiexec, each rank's share of its host's cores" if mpi else ""
    parser.add_argument("--threads", type=parse, metavar="N",
                        help="intra-op threads for every framework: torch, TensorFlow (intra- "
                             "and inter-op), onnxruntime, JAX's XLA, NumPy's BLAS (default: the "
                             "cores idle when the run starts, at least 1, of the "
                             f"{provenance.usable_cores()} this process may use{shared})")


def frameworks(backends: Iterable[str], extra: Iterable[str] = ()) -> list[str]:
    """The framework modules behind backend names (d500.backends.framework), plus `extra`."""
    from d500.backends import framework
    found = [fw[0] for fw in map(framework, backends) if fw is not None]
    return list(dict.fromkeys([*found, *extra]))


def configure(count: int | None = None, modules: Iterable[str] = (), *,
              fallback: tuple[int, str] | None = None) -> int:
    """Give every framework `count` threads at once: each of `modules` (framework modules:
    torch, tensorflow, onnxruntime, numpy; imported now), every framework already loaded, and
    NumPy's BLAS. Without `count`: `fallback` (a count and why it was chosen) when given, else
    `default()` (the usable cores where a framework this process already ran cannot change to
    it)."""
    if count is not None:
        n, why = count, "--threads"
    else:
        n, why = fallback if fallback is not None else _default()
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UsageError(f"thread count must be an integer >= 1, got {n!r}")
    from d500 import provenance
    try:
        _give(n, why, modules)
    except UsageError:
        if count is not None or fallback is not None or n == provenance.usable_cores():
            raise
        # a framework this process already ran (in-process use: a test, a notebook) keeps its
        # own default, the usable cores: the default is then that count, and says so
        n = provenance.usable_cores()
        _give(n, f"{USABLE_WHY} ({n}: a framework already running here keeps its own)", modules)
    return n


def _give(n: int, why: str, modules: Iterable[str]) -> None:
    """Record `n` and why, and give it to `modules`, the loaded frameworks and BLAS."""
    global _setting
    _setting = {"count": n, "set_by": why}
    from d500.backends import frameworks
    loaded = [fw.module for fw in frameworks()
              if fw.threads_when_loaded and fw.module in sys.modules]
    for module in dict.fromkeys([*modules, *loaded, "numpy"]):  # BLAS last: the frameworks
        apply(module, n)  # may have brought BLAS libraries of their own (scipy's OpenBLAS)


def _default() -> tuple[int, str]:
    """default() and why, as recorded: how many cores were idle of how many usable."""
    from d500 import provenance
    n = default()
    return n, f"{DEFAULT_WHY} ({n} of {provenance.usable_cores()} usable)"


def apply(module: str, n: int) -> None:
    """Set one framework's thread count now (importing it): its FRAMEWORK's `set_threads`
    (d500.backends.hooks); NumPy's module is the reference's, whose threads are BLAS's."""
    from d500.backends import by_module
    fw = by_module(module)
    if fw is not None:
        fw.set_threads(n)


def blas(n: int) -> None:
    """Every BLAS library loaded (NumPy's OpenBLAS, and those frameworks brought) through
    threadpoolctl, which changes them after they loaded."""
    global _blas_limits
    from threadpoolctl import threadpool_limits
    importlib.import_module("numpy")
    _blas_limits = threadpool_limits(limits=n, user_api="blas")


def session_options(options: Any) -> Any:
    """An onnxruntime SessionOptions with the configured count (unchanged when none is)."""
    if _setting is not None:
        options.intra_op_num_threads = _setting["count"]
        options.inter_op_num_threads = _setting["count"]
    return options


@contextmanager
def few_cores(n: int) -> Iterator[None]:
    """The calling thread on n of its usable cores meanwhile (unchanged where it has n or
    fewer, or off Linux; which n turns with the process id), then it and every thread started
    meanwhile on all of them again. XLA (JAX's client, TensorFlow's under jit_compile) sizes its
    compile pool when it first compiles, one thread per core the compiling thread may use (tsl's
    MaxParallelism; no flag sizes it): a first compile in here gives it n threads, which keep
    that size once widened (d500/backends/jax/framework.py). Left on the n cores, XLA's threads
    made digits-mlp's jax steps slower on a loaded machine (benchmarks/xla_threads.py)."""
    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) <= n:
        yield
        return
    usable = os.sched_getaffinity(0)
    before = set(os.listdir("/proc/self/task"))
    cores = sorted(usable)
    os.sched_setaffinity(0, [cores[(os.getpid() + i) % len(cores)] for i in range(n)])
    try:
        yield
    finally:
        os.sched_setaffinity(0, usable)
        for task in set(os.listdir("/proc/self/task")) - before:
            try:
                os.sched_setaffinity(int(task), usable)
            except OSError:
                continue  # a thread that ended meanwhile


def recorded() -> dict[str, Any] | None:
    """The count this process set and how it was chosen, for provenance; None when it set none
    (each framework then uses its own default)."""
    return None if _setting is None else dict(_setting)


def actual() -> dict[str, Any]:
    """What each loaded framework reports now (its FRAMEWORK's `threads`): NumPy's BLAS
    libraries, torch's and TensorFlow's pools, the count onnxruntime sessions get, ..."""
    from threadpoolctl import threadpool_info

    from d500.backends import frameworks
    found: dict[str, Any] = {"blas": sorted({pool["num_threads"] for pool in threadpool_info()
                                             if pool["user_api"] == "blas"})}
    found.update({fw.name: fw.threads() for fw in frameworks() if fw.reports_threads()})
    return found
