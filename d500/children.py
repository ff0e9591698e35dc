"""The processes that run an entry's code apart from the judge: started clean, bound to their
parent, without the capabilities that would let them read or patch the judge's memory, ended
politely and then by force.

    children.shield()                   # in the judge: its memory closed to the children
    ctx = children.context(["torch"])   # how to start one (a forkserver where it is safe)
    process = ctx.Process(target=main, args=(child,), daemon=True); process.start()
    children.bound_to_parent()          # first thing in the child
    children.confine()                  # then no capability left (before the entry's code)
    children.keep()                     # and a keeper that ends whatever it leaves behind
    children.take_environment(env)      # then the judge's environment, sent with the job
    children.end(conn, process)         # "exit" on its pipe, then a kill

A child is never forked from the judge, nor from any process that ran an entry's code: it is
spawned (a fresh interpreter) or, where the user set D500_WORKER_START=forkserver, forked by
multiprocessing's forkserver, a fresh
interpreter that this module starts once per judge process, from its main thread, with only
`PRELOAD` imported (NumPy, ONNX, torch and d500's torch backend: ~2.5 s that every spawned
level-2 worker imported again), for children that run torch or NumPy only (others are spawned:
a TensorFlow worker holds no torch). The forkserver holds nothing of the judge's memory (no
clock, no data), and each child is a new fork of it, so no child sees another's state. It dies
with the judge (d500.forkserver), and its children with it. A forkserver keeps the environment
it started with and its children do too: the judge sends its environment with each job, and
falls back to spawning when the variables the preloaded libraries read as they load
(`LOADED`: OpenMP, BLAS, torch, the dynamic linker, Python's own) differ from the forkserver's.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from typing import Any

PRELOAD = ["d500.forkserver", "numpy", "onnx", "torch", "d500.backends.torch.executable",
           "d500.training.worker", "d500.training.optimizers", "d500.training.data.samplers"]
PRELOADED = ("numpy", "torch")  # the frameworks (d500.backends.framework) in PRELOAD
LOADED = ("OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "TORCH", "PYTORCH_", "LD_", "PYTHON",
          "MALLOC_")
METHOD: str | None = None  # a start method to force ("spawn", "forkserver"): benchmarks/
# Workers are spawned unless the user asks for forks of the forkserver: a forked worker starts
# in ~1 s instead of ~3 s (20 s against 0.9 s at load 9), but its first steps ran slower than
# the judge's own process would (digits-mlp time to accuracy 1.37x in-process on a quiet machine,
# spawned 0.99x: benchmarks/isolation.py --start), inside the timed part, so by default timed
# runs do not pay for a faster start.
FORK = os.environ.get("D500_WORKER_START", "spawn") == "forkserver"
_server_env: dict[str, str] | None = None  # the LOADED variables the forkserver started with


def context(frameworks: list[str] | tuple[str, ...] = (), method: str | None = None) -> Any:
    """The multiprocessing context to start a child that runs `frameworks` (module names) with:
    the forkserver (started here on first use), or spawn where a forkserver is not available,
    would run with another environment than this process's, or would hold a framework the child
    does not run (a TensorFlow worker holds no torch); `method`, else METHOD, forces one."""
    global _server_env
    method = method or METHOD
    if method is None:
        fits = FORK and set(frameworks) <= set(PRELOADED) and _forkserver_fits()
        method = "forkserver" if fits else "spawn"
    if method == "forkserver" and _server_env is None:
        _start_forkserver()
        _server_env = _loaded(os.environ)
    return multiprocessing.get_context(method)


def environment() -> dict[str, str]:
    """This process's environment, for a child to take as its own (a forked child of the
    forkserver would have the forkserver's)."""
    return dict(os.environ)


def take_environment(env: dict[str, str] | None) -> None:
    """In the child: the judge's environment replaces the one it was started with."""
    if env is not None and env != os.environ:
        os.environ.clear()
        os.environ.update(env)


def bound_to_parent() -> None:
    """Die with the parent (Linux: PR_SET_PDEATHSIG; a forkserver's child dies with the
    forkserver, which ends when the judge does), and leave ^C to it."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def shield() -> None:
    """In a judge, before it starts a process that runs an entry's code: no other process of
    this user may read or write this one's memory (/proc/PID/mem, ptrace: the held-out data,
    the clock) without CAP_SYS_PTRACE, which `confine` takes from the entry's processes
    (Linux: PR_SET_DUMPABLE 0, which also stops core dumps of the judge)."""
    _prctl(4, 0)  # PR_SET_DUMPABLE


def confine() -> None:
    """In a child, before any of the entry's code: every capability dropped for good, so that
    its code, even run by root, cannot read or patch a judge's memory (the kernel then refuses
    it /proc/PID/mem and ptrace of a `shield`ed process, and of any holding capabilities it
    lacks): the bounding set emptied and root's privileges on exec locked off (securebits),
    then the capability sets cleared and no_new_privs set. Each step is one this process may
    take (an unprivileged user's have nothing to drop); a kernel without them refuses quietly."""
    import ctypes
    try:
        last = int(open("/proc/sys/kernel/cap_last_cap").read())
    except (OSError, ValueError):
        last = -1
    for cap in range(last + 1):
        _prctl(24, cap)  # PR_CAPBSET_DROP
    _prctl(28, 0x2F)  # PR_SET_SECUREBITS: NOROOT, NO_SETUID_FIXUP and KEEP_CAPS, each locked

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)())  # version 3: all zero
    except (OSError, AttributeError):
        pass
    _prctl(38, 1)  # PR_SET_NO_NEW_PRIVS


def keep() -> None:
    """In a child, before the entry's code (Linux): split in two. This process becomes the
    keeper, d500's code only: a subreaper that adopts whatever the entry's process leaves
    behind (a double fork), and once that process has ended kills and reaps all of it, then
    ends as it did (its exit code, or its signal). Returns only in the new process, which dies
    with its keeper. Nothing the entry starts outlives it: no process edits a file after the
    run or spins on the cores that another run's load record counts as others'."""
    if sys.platform != "linux":
        return
    keeper = os.getpid()
    _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    pid = os.fork()
    if pid == 0:
        _prctl(36, 0)
        bound_to_parent()  # (PR_SET_PDEATHSIG is not inherited across fork)
        if os.getppid() != keeper:  # the keeper died before the line above
            os._exit(1)
        return
    code = 1
    try:
        os.closerange(3, _max_fd())  # the pipes are the child's: its end must read as EOF
        code = _kept(pid)
    finally:
        os._exit(code)


def _kept(pid: int) -> int:
    """The keeper's work: reap until child `pid` ends, then end what is left; its exit code
    (a signal that ended it ends the keeper too)."""
    import signal
    reaped = False

    def stop(*_: Any) -> None:  # `end`'s SIGTERM: the child first, then what it left (below)
        if not reaped:  # (its pid is still its own: not yet reaped)
            os.kill(pid, signal.SIGKILL)

    signal.signal(signal.SIGTERM, stop)
    status = 1 << 8
    while True:  # reap adopted processes too, until the child has ended
        try:
            done, code = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if done == pid:
            status = code
            break
    reaped = True
    _end_adopted()
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1


def kept(pid: int) -> int:
    """The process a keeper `pid` keeps (the one that runs the entry's code: benchmarks pin or
    schedule it), or `pid` itself where it has no child (not yet split, or not Linux)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            found = f.read().split()
    except OSError:
        return pid
    return int(found[0]) if found else pid


def _end_adopted() -> None:
    """SIGKILL every live child of this process, and reap them, until none is left."""
    import signal
    while True:
        for pid in _children():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return
        except InterruptedError:
            continue


def _children() -> list[int]:
    found = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return found


def _max_fd() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (OSError, ValueError):
        return 1024


def _prctl(option: int, value: int) -> None:
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def end(conn: Any, process: Any, wait: float = 5.0) -> None:
    """End a child: "exit" on its pipe, `wait` s for it to go, then SIGTERM (a keeper kills the
    process it keeps and what that left behind: a SIGKILL would orphan them), then a kill; its
    pipe closed."""
    try:
        conn.send(("exit",))
    except (OSError, ValueError):
        pass
    process.join(timeout=wait)
    if process.is_alive():
        process.terminate()
        process.join(timeout=2)
    if process.is_alive():
        process.kill()
        process.join(timeout=5)
    conn.close()


def _start_forkserver() -> None:
    """Start the forkserver, importing what it preloads from this process's sys.path (Python
    3.11's forkserver ignores the sys.path it is given: PYTHONPATH carries it for the start)."""
    from multiprocessing import forkserver
    forkserver.set_forkserver_preload(PRELOAD)
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
    try:
        forkserver.ensure_running()
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


def _forkserver_fits() -> bool:
    """A forkserver is started only from the main thread: it dies with the thread that started
    it (d500.forkserver), which must outlive every child it forks."""
    if "forkserver" not in multiprocessing.get_all_start_methods() or sys.platform != "linux":
        return False
    if _server_env is None:
        return threading.current_thread() is threading.main_thread()
    return _server_env == _loaded(os.environ)


def _loaded(env: Any) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(LOADED)}
