"""The processes that run an entry's code apart from the judge: started clean, bound to their
parent, without the capabilities that would let them read or patch the judge's memory, ended
politely and then by force.

    children.shield()                   # in the judge: its memory closed to the children
    ctx = children.context(["torch"])   # how to start one (a forkserver where it is safe)
    process = ctx.Process(target=main, args=(child,), daemon=True); children.start(process)
    children.bound_to_parent()          # first thing in the child
    children.keep()                     # a keeper that ends whatever it leaves behind
    children.confine()                  # then no capability left (before the entry's code)
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
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from d500.errors import D500Error

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
    _die_with_parent(ignore_interrupt=True)


def _die_with_parent(ignore_interrupt: bool) -> None:
    if ignore_interrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start(process: Any) -> None:
    """`process.start()`, a spawned child ignoring ^C from its first instruction
    (`_interrupt_left`): it ignores ^C for good from `bound_to_parent` on anyway. (A forkserver's
    child inherits the forkserver's ^C, left since its start, and its start waits for the
    forkserver's preload: seconds in which this process must take a ^C.)"""
    if getattr(process, "_start_method", None) != "spawn":
        process.start()
        return
    with _interrupt_left():
        process.start()


@contextmanager
def _interrupt_left() -> Iterator[None]:
    """A spawn (a child, the forkserver) that inherits SIG_IGN for ^C (a signal's disposition,
    not its block, outlives exec): a ^C at its start-up (a terminal's reaches the whole process
    group) raised KeyboardInterrupt in its imports (site's, NumPy's) and printed their
    traceback under the judge's "interrupted". This process ignores ^C only while it forks and
    execs the child (multiprocessing's util.spawnv_passfds, wrapped meanwhile), with ^C held
    blocked, and takes one that came as soon as the exec is done (Linux keeps a blocked signal
    pending even while it is ignored). Not around the whole start: a spawn's start waits for the
    child to read its start-up data (~0.2 s under load), and a ^C then taken by another of this
    process's threads, which do not block it, was dropped as ignored: the run trained on."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is None:  # (handlers: main's; one set in C: kept)
        yield
        return
    from multiprocessing import util
    spawn = util.spawnv_passfds

    def ignoring(*args: Any, **kwargs: Any) -> Any:
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            return spawn(*args, **kwargs)
        finally:
            signal.signal(signal.SIGINT, handler)
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    util.spawnv_passfds = ignoring
    try:
        yield
    finally:
        util.spawnv_passfds = spawn


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


def keep(forward: bool = False, shown: Any = ()) -> str:
    """In a child, before the entry's code and before `confine` (Linux): split in two. This
    process becomes the keeper, d500's code only (confined, undumpable): a subreaper that ends,
    once the kept process has ended, all it left behind, then ends as it did (its exit code, or
    its signal). Returns only in the kept process, which dies with its keeper; the caller then
    confines it. Nothing the entry starts outlives it: no process edits a file after the run or
    spins on the cores that another run's load record counts as others'.

    Where the kernel lets this process (root, or a user namespace), the kept side runs in a PID
    namespace of its own (`_isolated`): its pid 1 is d500's (`_init`), the entry's process its
    child, and when that ends pid 1 does, and the kernel kills all the namespace holds; no
    process in it can name, so signal, the keeper or the judge. Elsewhere a kept process could
    kill its keeper (same user) and leave orphans to init. It also gets a mount namespace in
    which it writes only the temporary folder, devices and the results directory's cache
    (`_read_only`): not the ledger, d500's code, its Python nor the system's files; and in
    which it reads nothing of the results directory but that cache (`_hide_home`): not the
    ledger (a checkpointing run's evaluations so far), the MLLOGs, the checkpoints, other runs'
    rows nor a dataset stored there. `shown`: folders it reads there all the same, read-only
    (the entry's own, where its files lie in the results directory: `d500 reproduce` writes
    them there). Where the kernel refuses namespaces (a subreaper only), none of this: the
    entry's process reads and writes what its user may.

    `forward` (an MPI rank, whose peers' MPI reads its memory by pid: never in a namespace of
    its own): the keepers pass on the signals a launcher sends (^C, hydra's SIGTERM and SIGUSR1)
    instead of ending the rank. Hydra SIGKILLs the process it started when a job aborts, so that
    one only waits: the rank's keeper is its child, in a session of its own, and ends the rank
    and all it left behind when the waiter dies. Says which keeper runs: "namespace",
    "subreaper", or "" (not Linux)."""
    if sys.platform != "linux":
        return ""
    if forward:
        waiter = os.getpid()
        _split(forward=True)  # returns in the keeper, the child of the process hydra waits on
        os.setsid()  # out of hydra's process group
        signal.pthread_sigmask(signal.SIG_BLOCK, {ORPHANED})  # (handled once the rank is split)
        _prctl(1, ORPHANED)  # PR_SET_PDEATHSIG: the waiter is gone
        if os.getppid() != waiter:  # it died before the line above
            os._exit(1)
        _split(forward=True, orphaned=True)
        _code_read_only()  # (the entry's code runs here: d500's and Python's files read-only)
        return "subreaper"
    isolated = _isolated(shown)
    if not isolated and os.environ.get("D500_DEBUG") == "1":
        print("d500: debug: no PID namespace permitted here (unshare refused): the entry's "
              "processes are kept by a subreaper only, which they could kill", file=sys.stderr)
    keeper = os.getpid()
    told = _split(forward=False, isolated=isolated)
    if isolated:
        _init(told, keeper)
    return "namespace" if isolated else "subreaper"


def _split(forward: bool, isolated: bool = False, orphaned: bool = False) -> int:
    """Fork; this process keeps the child (`_kept`) and ends as it does. Returns only in the
    child, which dies with it: the pipe end on which a namespace's pid 1 tells the keeper the
    entry's wait status (`isolated`), else -1."""
    _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    alive, held = os.pipe()  # the keeper holds `held`: a read of `alive` ends once it is gone
    said, told = os.pipe() if isolated else (-1, -1)
    passed = {getattr(signal, name) for name in FORWARDED} if forward else set()
    passed |= {ORPHANED} if orphaned else set()
    signal.pthread_sigmask(signal.SIG_BLOCK, passed)  # held until the keeper passes them on
    pid = os.fork()
    if pid == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, passed)
        _prctl(36, 0)
        os.close(held)
        _die_with_parent(ignore_interrupt=not forward)  # (PDEATHSIG is not inherited by fork)
        import select
        if select.select([alive], [], [], 0)[0]:  # at EOF: the keeper died before that line
            os._exit(1)
        os.close(alive)
        if isolated:
            os.close(said)
        return told
    code = 1
    try:
        code = _kept(pid, passed, held, said)
    finally:
        os._exit(code)


def _isolated(shown: Any = ()) -> bool:
    """A new PID namespace for this process's next child: root's (CAP_SYS_ADMIN), else in a
    user namespace of its own that maps this user to itself, where the kernel allows one
    (unprivileged user namespaces); False where neither is permitted. Its mounts: `_read_only`'s
    (`shown`: `keep`'s), what they need made first (`_skeleton`: root without capabilities, a
    rank's child, may not map itself in a user namespace (Linux 5.12+: mapping uid 0 needs
    CAP_SETFCAP), and with no user mapped it creates no file in a filesystem mounted there, a
    tmpfs: EOVERFLOW; on the host's, its cache and the temporary folder, it still writes, the
    files root's)."""
    import ctypes
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    newpid, newuser, newns = 0x20000000, 0x10000000, 0x00020000
    if libc.unshare(newpid | newns) == 0:
        _read_only(libc, _skeleton(shown))
        return True
    skeleton = _skeleton(shown)  # (before: in the user namespace this user may be unmapped)
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(newuser | newpid | newns) != 0:
        return False
    try:
        for name, text in (("uid_map", f"{uid} {uid} 1"), ("setgroups", "deny"),
                           ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    except OSError:
        pass  # unmapped: the user reads as the overflow id inside, files stay this user's
    _read_only(libc, skeleton)
    return True


def _read_only(libc: Any, skeleton: tuple[str, list[str]] | None = None) -> bool:
    """In a mount namespace of this process's own, the files an entry's process may write: the
    temporary folder (tempfile.gettempdir()), devices, /proc and the results directory's cache
    (`writable()`); every other mount is made read-only, and `protected()` is bound read-only
    onto itself (it may lie in the temporary folder), so that the entry's code cannot write
    what a judge reads later: the ledger, d500's code, its Python (a .pth file that every
    later interpreter runs), the system's libraries and /etc (a root entry wrote
    /etc/ld.so.preload, which every later process loads). The
    namespace is first made a slave of the one it came from, or nothing is mounted (a bind in
    a shared tree would propagate to the judge's). Once the entry is confined it may not
    unmount them, nor in a user namespace of its own (the kernel locks mounts inherited from
    a more privileged namespace, and refuses to bind a mount whose children are locked
    without them). Then the results directory is hidden (`_hide_home`, with `skeleton`:
    `_skeleton`'s) but for `writable()` and the entry's folder (read-only). The working
    directory is re-entered last, through the new mounts (the old one reached the writable
    mount, or under the cover, by relative paths): where it lay in a folder now hidden, its
    nearest folder still seen. False where a step was refused."""
    import tempfile
    rec, slave, rdonly = 0x4000, 0x80000, 0x1
    if libc.mount(None, b"/", None, rec | slave, None) != 0:
        return False
    view = viewer(libc)
    from d500.paths import enter_entry_cache
    done, temp = True, os.path.realpath(tempfile.gettempdir())  # (it tries a write: first)
    for path in writable():  # (made by `_skeleton`)
        enter_entry_cache(path)  # this process's caches (d500.paths.cache)
        done &= os.path.isdir(path)
    for path in _mounts():
        if not _under(path, "/proc") and not _under(path, "/sys") and not _under(path, "/dev"):
            done &= view(path, rdonly, again=False)
    for path, mode in ([(temp, 0)] + [(p, rdonly) for p in protected()] +
                       [(p, 0) for p in writable()]):
        done &= view(path, mode)
    if skeleton is not None:
        done &= _hide_home(libc, skeleton, view)
    reenter()
    return done


def reenter() -> None:
    """Re-enter the working directory through this namespace's mounts as they are now (the old
    one reached what a mount since covered, by relative paths): where it lies in a folder now
    hidden, its nearest folder still seen."""
    try:
        where = os.getcwd()
    except OSError:
        return
    for folder in [where, *map(str, Path(where).parents)]:
        try:
            os.chdir(folder)
            return
        except OSError:
            continue


def viewer(libc: Any) -> Callable[..., bool]:
    """`view(path, mode, again=True)`: bind `path` onto itself (`again`), then remount that bind
    with `mode` (MS_RDONLY, or 0: writable), keeping the flags a user namespace may not clear;
    whether both were done."""
    rec, bind, remount = 0x4000, 0x1000, 0x20
    locked = ((os.ST_NOSUID, 0x2), (os.ST_NODEV, 0x4), (os.ST_NOEXEC, 0x8),
              (os.ST_NOATIME, 0x400), (os.ST_NODIRATIME, 0x800), (os.ST_RELATIME, 0x200000))

    def flags(path: str) -> int:  # (a user namespace may not clear them)
        return sum(ms for st, ms in locked if os.statvfs(path).f_flag & st)

    def view(path: str, mode: int, again: bool = True) -> bool:
        where = os.fsencode(path)
        try:
            if again and libc.mount(where, where, None, bind | rec, None) != 0:
                return False
            return libc.mount(None, where, None, remount | bind | mode | flags(path), None) == 0
        except OSError:  # (statvfs: a mount point this process cannot reach)
            return False

    return view


def _skeleton(shown: Any = ()) -> tuple[str, list[str]] | None:
    """Before the split's namespaces: the folders an entry's process needs that lie in the
    results directory ($D500_HOME), each to be bound back into the cover that hides the rest
    (`_hide_home`), and that cover: a folder of the judges' cache, cache/cover/KEY (KEY: the
    digest of those folders' paths), holding an empty folder at each one's path, made now
    (with the entries' cache, `writable()`). The folders: the entries' cache, the entry's own
    (`shown`, where its files lie there: `d500 reproduce` writes them there), any of d500's
    code, its Python, sys.path or the temporary folder. None where the results directory is
    missing (nothing to hide), is itself one of them, or the cover cannot be made."""
    import hashlib
    import tempfile
    for path in writable():
        try:
            os.makedirs(path, exist_ok=True)
        except OSError:
            pass
    home = os.path.realpath(os.path.expanduser(_home()))
    if not os.path.isdir(home):
        return None
    needed = sorted({os.path.realpath(p) for p in [tempfile.gettempdir(), *_code(path=True),
                                                   *shown, *writable()]
                     if p and os.path.isdir(p)})
    if home in needed:
        return None
    back: list[str] = []
    for path in needed:
        if _under(path, home) and not any(_under(path, p) for p in back):
            back.append(path)
    inside = [os.path.relpath(p, home) for p in back]
    cover = os.path.join(home, "cache", "cover",
                         hashlib.sha256("\0".join(inside).encode()).hexdigest()[:16])
    try:
        for path in [cover, *(os.path.join(cover, p) for p in inside)]:
            os.makedirs(path, exist_ok=True)
    except OSError:
        return None
    return cover, back


def _hide_home(libc: Any, skeleton: tuple[str, list[str]], view: Callable[..., bool]) -> bool:
    """Cover the results directory ($D500_HOME) with `_skeleton`'s cover, read-only (`view`:
    `_read_only`'s), then bind back into it, at their own paths, the folders it names (each as
    `_read_only` made it: the entries' cache writable, the entry's own folder and any of d500's
    code or Python read-only), each from a descriptor opened before the cover. Nothing else of
    it is seen: not the ledger, the MLLOGs, the checkpoints, the judges' caches (their Inductor
    kernels, the ONNX node tests' pickle, the peak FLOP/s, the token caches, generated models: a
    level-1 host is sent a model that lies there as bytes, d500.networks.hosted), nor the
    packages and reproductions of other entries. Undone (the directory read-only, as before)
    where a step is refused."""
    cover, back = skeleton
    home = os.path.realpath(os.path.expanduser(_home()))
    bind, rec = 0x1000, 0x4000
    opened: list[int] = []
    try:
        opened = [os.open(p, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for p in [cover, *back]]
        if libc.mount(f"/proc/self/fd/{opened[0]}".encode(), os.fsencode(home), None,
                      bind | rec, None) != 0:
            return False
        done = view(home, 0x1, again=False)  # MS_RDONLY
        for fd, path in zip(opened[1:], back):
            done = done and libc.mount(f"/proc/self/fd/{fd}".encode(), os.fsencode(path), None,
                                       bind | rec, None) == 0
        if not done:
            libc.umount2(os.fsencode(home), 2)  # MNT_DETACH: what was bound back with it
        return done
    except OSError:
        return False
    finally:
        for fd in opened:
            os.close(fd)


def _home() -> str:
    from d500.paths import home_named
    return home_named()


def hidden(path: str | os.PathLike[str]) -> bool:
    """Whether an entry's process kept in a namespace does not see `path` (`_hide_home`): it
    lies in the results directory, outside the entries' cache."""
    home = os.path.realpath(os.path.expanduser(_home()))
    real = os.path.realpath(os.path.expanduser(os.fspath(path)))
    return _under(real, home) and not any(_under(real, p) for p in writable())


def _mounts() -> list[str]:
    """This mount namespace's mount points, parents first."""
    found = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                point = line.split()[4]
                found.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), point))
    except OSError:
        return []
    return sorted(set(found), key=lambda p: (p.count("/"), p))


def protected() -> list[str]:
    """The folders an entry's process sees read-only: the results directory ($D500_HOME: the
    ledger), the folder d500 is imported from, the Python installation and virtual environment
    (sys.prefix, sys.base_prefix) and the user's site-packages; never the root or the temporary
    folder a library writes its caches in, nor a folder holding it. $D500_HOME is read as the
    split runs: a level-2 worker takes its job's environment first (a fork of the forkserver
    had the forkserver's, and a judge that changed it since, a test or a notebook, left its new
    results directory writable and seen), a host is spawned with the judge's, the probe run
    with it."""
    import tempfile

    found = [_home(), *_code()]
    temp = os.path.realpath(tempfile.gettempdir())
    paths: list[str] = []
    for path in sorted({os.path.realpath(os.path.expanduser(p)) for p in found}):
        if not os.path.isdir(path) or path == "/" or _under(temp, path):
            continue
        if not any(_under(path, p) for p in paths):
            paths.append(path)
    return paths


def _code_read_only() -> bool:
    """An MPI rank (keep(forward=True)), where the kernel permits (root): a mount namespace of
    its own, no PID namespace, in which d500's code and its Python (`_code`) are read-only, so
    that no rank's entry code rewrites a module the level-3 judge, rank 0's child, imports
    after it ran (a patched lm.py had the judge evaluate on training windows) or that a later
    run imports; $D500_HOME stays as it is here, where rank 0's judges write the ledger
    (d500.distributed.cover covers it in the rank's own namespace before the entry's code).
    False where refused: then the rank writes what its user can (README)."""
    import ctypes
    rec, slave, bind, remount, rdonly = 0x4000, 0x80000, 0x1000, 0x20, 0x1
    home = os.path.realpath(os.path.expanduser(_home()))
    code = sorted({os.path.realpath(p) for p in _code()})
    code = [p for i, p in enumerate(code) if not any(_under(p, q) for q in code[:i])]
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if any(_under(home, p) for p in code):
            os.makedirs(home, exist_ok=True)  # (the judge makes it later: no longer writable)
        if libc.unshare(0x20000) != 0:  # CLONE_NEWNS
            return False
    except (OSError, AttributeError):
        return False

    def view(path: str, mode: int) -> bool:
        where = os.fsencode(path)
        return (libc.mount(where, where, None, bind | rec, None) == 0 and
                libc.mount(None, where, None, remount | bind | mode, None) == 0)

    done = libc.mount(None, b"/", None, rec | slave, None) == 0
    done = done and all([view(p, rdonly) for p in code])
    if done and any(_under(home, p) for p in code):
        done = view(home, 0)
    return done


def _code(path: bool = False) -> list[str]:
    """The folders of the code an entry's process runs on: the folder d500 is imported from,
    the Python installation and virtual environment and the user's site-packages (`path`:
    every folder on sys.path too)."""
    import site
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = [here, sys.prefix, sys.base_prefix, sys.exec_prefix,
             *(filter(None, sys.path) if path else [])]
    try:
        found.append(site.getusersitepackages())
    except (AttributeError, OSError):
        pass
    return [p for p in found if os.path.isdir(p)]


def writable() -> list[str]:
    """Within `protected()`, what an entry's process still writes: the results directory's
    entries' cache (d500.paths.entry_cache: Inductor's compiled kernels, which a torch:compiled
    worker writes), where d500.paths.cache puts every cache of that process; the judges' own
    caches beside it (Inductor's, the ONNX node tests' pickle, the peak FLOP/s) stay read-only
    to it. Open: one entry's process may write what another entry's reads there later."""
    from d500.paths import entry_cache, home_named
    home = os.path.realpath(os.path.expanduser(home_named()))
    return [entry_cache(home)] if os.path.isdir(home) else []


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _own_proc() -> bool:
    """In a namespace's pid 1, before the entry's process starts: a /proc of the namespace's
    own, in a mount namespace of pid 1's own (its keeper, outside, keeps the host's). The
    entry's processes see only each other there, and their pids and thread ids are those /proc
    names: on the host's /proc, a thread named by another (XLA names its pool's threads so)
    was named through /proc/self/task/TID with the namespace's TID, another thread there, and
    the framework's thread count read from the names was wrong. False where refused (a user
    namespace whose /proc is partly hidden): the host's stays."""
    import ctypes
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    rec, slave, nosuid, nodev, noexec = 0x4000, 0x80000, 0x2, 0x4, 0x8
    if libc.unshare(0x00020000) != 0 or libc.mount(None, b"/", None, rec | slave, None) != 0:
        return False
    return libc.mount(b"proc", b"/proc", b"proc", nosuid | nodev | noexec, None) == 0


def _init(told: int, keeper: int) -> None:
    """Pid 1 of the kept namespace, d500's code: start the entry's process, with pid `keeper`
    where the kernel lets it choose (each concurrent run's then differs: files named by pid do
    not collide), reap every orphan of the namespace, and once that process has ended tell the
    keeper its wait status on `told` and end: the kernel then kills all the namespace holds.
    Returns only in the entry's process, whose parent (this) stays, so getppid() is 1."""
    _own_proc()
    try:
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(max(1, keeper - 1)))
    except OSError:
        pass
    pid = os.fork()
    if pid == 0:
        os.close(told)
        return
    shield()
    confine()
    os.closerange(3, told)
    os.closerange(told + 1, _max_fd())
    status = _reap_until(pid)  # pid 1 is sent no signal it has no handler for: the keeper's
    if status is not None:  # SIGKILL alone ends it
        os.write(told, status.to_bytes(4, "little"))
    os._exit(0)


FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM")
ORPHANED = getattr(signal, "SIGPWR", 30)  # a rank's keeper: the process hydra waits on died


def _kept(pid: int, passed: set[int], held: int, said: int) -> int:
    """The keeper's work: reap until child `pid` ends, then end what is left; its exit code
    (a signal that ended it ends the keeper too). `passed`: the signals passed on to the child
    (ORPHANED among them kills it); none: SIGTERM (`end`'s) kills it. `held`: the pipe end it
    keeps open; `said` (a namespace's pid 1's): the pipe on which that tells the entry's wait
    status, taken as the child's."""
    reaped = False

    def stop(*_: Any) -> None:  # `end`'s SIGTERM: the child first, then what it left (below)
        pass_on(signal.SIGKILL, None)

    def pass_on(sig: int, _: Any) -> None:
        if not reaped:  # (its pid is still its own: not yet reaped)
            try:  # (reaped already, where the signal came between the wait and the flag: the
                os.kill(pid, sig)  # error it raised here ended the keeper with exit code 1)
            except ProcessLookupError:
                pass

    def abort(*_: Any) -> None:  # a rank's job is gone (hydra SIGKILLed the waiter): all at
        for child in [pid, *_descendants(os.getpid())]:  # once, as a SIGKILL of the job would,
            try:  # so that no process of it (rank 0's judge) records an end in between
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass

    for sig in passed:
        signal.signal(sig, abort if sig == ORPHANED else pass_on)
    if not passed:
        signal.signal(signal.SIGTERM, stop)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, passed)
    confine()
    shield()  # the kept process, as this user, cannot ptrace it
    os.closerange(3, held)  # the pipes are the child's: its end must read as EOF
    os.closerange(held + 1, said if said >= 0 else _max_fd())
    if said >= 0:
        os.closerange(said + 1, _max_fd())
    status = _reap_until(pid)
    if status is None:
        status = 1 << 8
    reaped = True
    if said >= 0:
        told = os.read(said, 4)
        if len(told) == 4:
            status = int.from_bytes(told, "little")
    _end_adopted()
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1


def _reap_until(pid: int) -> int | None:
    """Reap this process's children, the orphans it adopted too, until child `pid` ends: its
    wait status; None where no child was left before it."""
    while True:
        try:
            done, code = os.waitpid(-1, 0)
        except ChildProcessError:
            return None
        except InterruptedError:
            continue
        if done == pid:
            return code


def kept(pid: int) -> int:
    """The process that runs the entry's code behind keeper `pid` (benchmarks pin or schedule
    it): the keeper's child, or that child's where it is a PID namespace's pid 1 (`_init`);
    `pid` itself where it has no child (not yet split, or not Linux)."""
    found = of(pid)
    if not found:
        return pid
    child = found[0]
    try:
        if os.readlink(f"/proc/{child}/ns/pid") != os.readlink("/proc/self/ns/pid"):
            return (of(child) or [child])[0]
    except OSError:
        pass
    return child


class Unheld(D500Error):
    """A process behind a keeper did not stop within `hold`'s deadline (or may not be signalled):
    the entry could compute on while the judge works off the clock, so the run fails (`hold`
    let what it stopped go on first)."""


def hold(keeper: int, deadline: float = 5.0, spare: Any = ()) -> list[int]:
    """Stop every process behind `keeper` (a worker's d500 keeper): the entry's process, all it
    started and the orphans its namespace's pid 1 adopted, and wait until each of their threads
    has stopped. A judge holds them while it works off the clock (test accuracy): no thread of
    the entry's computes on time that no figure counts. The tree is read again once all it
    found have stopped, until a reading finds nothing new: a process forked after a reading (or
    missed by it: a chain of processes, each forking and ending, moves under the namespace's
    pid 1 as it goes) is stopped too (tests/test_children_hold.py); Unheld where one has not
    stopped within `deadline` s, or may not be signalled. `spare`: pids left running, their
    children stopped (level 3's judge, its ranks' keepers: d500's own, d500.distributed.jobtree).
    The pids, for `release`."""
    held: list[int] = []
    end = time.monotonic() + deadline
    while True:  # (a process may fork while the others stop)
        new = [p for p in _descendants(keeper) if p not in held and p not in spare]
        for pid in new:
            _stop(pid, held)
        if not new and all(_stopped(p) for p in held):  # read with all it found stopped
            return held
        for pid in held:
            while not _stopped(pid):
                if time.monotonic() > end:
                    release(held)
                    raise Unheld(f"process {pid} behind the worker did not stop within "
                                 f"{deadline:g} s of SIGSTOP")
                # asleep 20 us between looks, not yielding: a judge running SCHED_FIFO yields
                # to no ordinary thread, and the threads to stop, which must run to stop,
                # waited on a loaded machine for the other CPU (a hold took 24 ms at load 10,
                # 1.2 ms so)
                time.sleep(20e-6)
                with suppress(OSError):  # again: a SIGCONT (from one of them not
                    os.kill(pid, signal.SIGSTOP)  # yet stopped) undid the first


def _stop(pid: int, held: list[int]) -> None:
    """SIGSTOP `pid`, added to `held`; a process gone is not; Unheld (all `held` let go) where
    it may not be signalled."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        return
    except PermissionError:
        release(held)
        raise Unheld(f"process {pid} behind the worker may not be stopped (SIGSTOP: "
                     "permission denied)") from None
    held.append(pid)


def release(held: list[int]) -> None:
    """Let the processes `hold` stopped run on."""
    for pid in held:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def cpu_seconds(keeper: int, spare: tuple[int, ...] = ()
                ) -> tuple[float, dict[int, tuple[float, ...]]]:
    """The CPU seconds (user + system, every thread) that `keeper` and all behind it used so far
    (but the live processes `spare` and all behind them: level 3's judge, rank 0's child):
    the entry's process, what it started, and those reaped (by their parent, or as orphans by
    the namespace's pid 1: in its cutime/cstime); and, by live thread id, the seconds it ran and
    the seconds it waited runnable for a CPU (schedstat's first two fields: on a loaded machine
    a thread wants more than it gets), the times it was put on a CPU (its third) and its
    voluntary and involuntary context switches (status; d500.training.cpu.counted). A live
    process's own CPU time is its CPU clock's (nanoseconds, its ended threads' exactly), the
    reaped ones' /proc's ticks (10 ms).
    Open: a child of a process that ignores SIGCHLD is reaped without its time counted, and a
    thread's own figures end with it (its CPU time stays in its process's)."""
    tick = os.sysconf("SC_CLK_TCK")
    total, live = 0.0, {}
    left = {p for s in spare for p in (s, *_descendants(s))}
    for pid in [p for p in (keeper, *_descendants(keeper)) if p not in left]:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks = [int(v) for v in fields[11:15]]  # utime stime cutime cstime
        except (OSError, IndexError, ValueError):
            continue
        try:  # the process's CPU clock (clock_getcpuclockid's: CPUCLOCK_SCHED of pid)
            total += time.clock_gettime_ns(((~pid) << 3) | 2) / 1e9 + sum(ticks[2:]) / tick
        except OSError:  # gone meanwhile: its ticks
            total += sum(ticks) / tick
        for task in _tasks(pid):
            try:
                with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                    ran, waited, slices = f.read().split()[:3]
                live[int(task)] = (int(ran) / 1e9, int(waited) / 1e9, int(slices),
                                   *_switches(f"/proc/{pid}/task/{task}/status"))
            except (OSError, ValueError):
                pass
    return total, live


def _switches(status: str) -> tuple[int, int]:
    """A thread's (voluntary, involuntary) context switches so far, from its status file: it
    slept, or it was taken off a CPU it still wanted (a yield too)."""
    with open(status) as f:
        found = dict(line.split(":", 1) for line in f if "ctxt_switches:" in line)
    return int(found.get("voluntary_ctxt_switches", 0)), \
        int(found.get("nonvoluntary_ctxt_switches", 0))


def _descendants(pid: int) -> list[int]:
    """The processes below `pid`: its children, theirs, and so on."""
    found, todo = [], [pid]
    while todo:
        kids = of(todo.pop())
        found += kids
        todo += kids
    return found


def of(pid: int | str = "self") -> list[int]:
    """The children of process `pid` ("self": this one), every thread's (a child is listed under
    the thread that started it); none where it is gone. The one reader of /proc's process tree
    (d500.distributed.jobtree's too)."""
    found = []
    for task in _tasks(pid):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            pass
    return found


def _tasks(pid: int | str) -> list[str]:
    """The thread ids of process `pid` as /proc names them, the main thread first; none where it
    is gone."""
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def _stopped(pid: int) -> bool:
    """Whether every thread of `pid` is stopped (or the process is gone), or in an
    uninterruptible wait ("D"), which runs nothing and takes its pending SIGSTOP before it runs
    the process's code again: a parent waiting for its vfork child (Python's subprocess), whose
    child is stopped, waits there as long as it is held."""
    for task in _tasks(pid):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("T", "t", "Z", "X", "D"):
            return False
    return True


def _end_adopted() -> None:
    """SIGKILL every live child of this process, and reap them, until none is left."""
    while True:
        for pid in of():
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
        with _interrupt_left():  # (its children then ignore ^C from their start too)
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
