"""One intra-op thread count for every framework d500 times (torch, TensorFlow's intra- and inter-op
pools, onnxruntime's sessions, OpenVINO's compiled models, JAX's XLA CPU pool, NumPy's BLAS), set
once per process: comparisons are fair only then.

    from d500 import threads
    threads.configure(4, threads.frameworks(["torch", "tensorflow"]))  # before anything runs
    threads.recorded()  # {"count": 4, "set_by": "--threads"}: part of every run's provenance
    threads.actual()    # what each loaded framework reports now

The default is the number of cores this process may use (`os.sched_getaffinity`); a caller may
give another default with its reason (`d500 train`/`d500 tune` under MPI: each rank's share of
its host's cores, d500.distributed.launch.core_share). TensorFlow
fixes its pools when its runtime starts, so configure() sets them before TensorFlow runs
anything; if it already ran with another count, the count cannot change in this process and
configure() raises a UsageError saying so (TensorFlow's own default, one thread per usable core,
counts as the default count). The count is set through each framework's API, not
the environment: child processes (MPI ranks sharing the cores, d500.distributed.launch) keep
choosing their own. XLA has no such API: its CPU client sizes its intra-op pool once, when JAX first
computes (see `_jax`); a count given after that raises a UsageError, as TensorFlow's does.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Iterable
from typing import Any

from d500.errors import UsageError

DEFAULT_WHY = "default: the cores this process may use"
_setting: dict[str, Any] | None = None
_blas_limits: Any = None  # threadpoolctl's limiter, kept for the life of the process


def default() -> int:
    """The count used without --threads: the cores this process may use."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def parse(text: str) -> int:
    """argparse type of `--threads N`: an integer >= 1."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a number of threads >= 1, got {text!r}")
    return int(text)


def add_option(parser: argparse.ArgumentParser, mpi: bool = False) -> None:
    """`--threads N`, as `op bench`, `net bench`, `run`, `train` and `tune` take it (`mpi`: the
    command may run as MPI ranks, which share a host's cores by default)."""
    shared = "; under mpiexec, each rank's share of its host's cores" if mpi else ""
    parser.add_argument("--threads", type=parse, metavar="N",
                        help="intra-op threads for every framework: torch, TensorFlow (intra- "
                             "and inter-op), onnxruntime, JAX's XLA, NumPy's BLAS (default: the "
                             f"cores this process may use, here {default()}{shared})")


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
    `default()`."""
    global _setting
    if count is not None:
        n, why = count, "--threads"
    else:
        n, why = fallback if fallback is not None else (default(), DEFAULT_WHY)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UsageError(f"thread count must be an integer >= 1, got {n!r}")
    _setting = {"count": n, "set_by": why}
    loaded = [m for m in ("torch", "tensorflow") if m in sys.modules]  # jax: only when asked
    for module in dict.fromkeys([*modules, *loaded, "numpy"]):  # BLAS last: the frameworks
        apply(module, n)  # may have brought BLAS libraries of their own (scipy's OpenBLAS)
    return n


def apply(module: str, n: int) -> None:
    """Set one framework's thread count now (importing it)."""
    if module == "numpy":
        _blas(n)
    elif module == "torch":
        import torch
        torch.set_num_threads(n)
    elif module == "tensorflow":
        _tensorflow(n)
    elif module == "jax":
        _jax(n)
    elif module in ("onnxruntime", "openvino"):
        pass  # per session or compiled model: each reads recorded()'s count when it is made


def _blas(n: int) -> None:
    """Every BLAS library loaded (NumPy's OpenBLAS, and those frameworks brought) through
    threadpoolctl, which changes them after they loaded."""
    global _blas_limits
    from threadpoolctl import threadpool_limits
    importlib.import_module("numpy")
    _blas_limits = threadpool_limits(limits=n, user_api="blas")


def _tensorflow(n: int) -> None:
    from d500.backends import import_quietly
    threading = import_quietly("tensorflow").config.threading
    for what, get, set_ in (
            ("intra-op", threading.get_intra_op_parallelism_threads,
             threading.set_intra_op_parallelism_threads),
            ("inter-op", threading.get_inter_op_parallelism_threads,
             threading.set_inter_op_parallelism_threads)):
        if get() == n or (get() == 0 and n == default()):
            continue  # 0: TensorFlow's own choice, one thread per usable core, as d500's default
        try:
            set_(n)
        except RuntimeError:
            now = get() or "its default"
            raise UsageError(
                f"TensorFlow already runs with {now} {what} threads in this process and cannot "
                f"change to {n}: the thread count must be set before TensorFlow runs anything "
                f"(give --threads to a new d500 process)") from None


def _jax(n: int) -> None:
    """Start JAX's CPU client with an intra-op pool of n threads. jaxlib 0.10.2's XLA sizes that
    pool (its "XLAEigen" threads, which run every op's parallel work) from the environment
    variable NPROC when the client starts (XLA's DefaultThreadPoolSize), else from the usable
    cores; XLA_FLAGS' `intra_op_parallelism_threads=1` and `--xla_cpu_multi_thread_eigen=false`
    change nothing there (measured: CPU/wall time 1.75 with them on this 2-core machine, 0.98 with
    NPROC=1). So NPROC is n while the client starts, and put back after: child processes choose
    their own."""
    now = xla_pool()
    if now is not None:
        if now != n:
            raise UsageError(
                f"JAX already runs with {now} XLA threads in this process and cannot change to "
                f"{n}: the thread count must be set before JAX computes anything (give --threads "
                f"to a new d500 process)")
        return
    saved = os.environ.get("NPROC")
    os.environ["NPROC"] = str(n)
    try:
        importlib.import_module("jax").devices()  # the client (and its pool) starts here
    finally:
        if saved is None:
            del os.environ["NPROC"]
        else:
            os.environ["NPROC"] = saved


def xla_pool() -> int | None:
    """How many threads XLA's CPU pool has in this process (its threads are named "XLAEigen"),
    read from /proc/self/task; None before JAX's client started (or off Linux)."""
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


def session_options(options: Any) -> Any:
    """An onnxruntime SessionOptions with the configured count (unchanged when none is)."""
    if _setting is not None:
        options.intra_op_num_threads = _setting["count"]
        options.inter_op_num_threads = _setting["count"]
    return options


def recorded() -> dict[str, Any] | None:
    """The count this process set and how it was chosen, for provenance; None when it set none
    (each framework then uses its own default)."""
    return None if _setting is None else dict(_setting)


def actual() -> dict[str, Any]:
    """What each loaded framework reports now: torch's and TensorFlow's pools, NumPy's BLAS
    libraries, the count onnxruntime sessions get."""
    from threadpoolctl import threadpool_info
    found: dict[str, Any] = {"blas": sorted({pool["num_threads"] for pool in threadpool_info()
                                             if pool["user_api"] == "blas"})}
    if "torch" in sys.modules:
        found["torch"] = sys.modules["torch"].get_num_threads()
    if "tensorflow" in sys.modules:
        threading = sys.modules["tensorflow"].config.threading
        found["tensorflow"] = {"intra": threading.get_intra_op_parallelism_threads(),
                               "inter": threading.get_inter_op_parallelism_threads()}
    found["onnxruntime"] = None if _setting is None else _setting["count"]
    if "jax" in sys.modules:  # XLA's CPU pool as this process's threads show it
        found["jax"] = xla_pool()
    if "openvino" in sys.modules:  # INFERENCE_NUM_THREADS of each compiled model
        found["openvino"] = None if _setting is None else _setting["count"]
    return found
