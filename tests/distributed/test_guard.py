"""A rank's seccomp filter (d500.distributed.guard), loaded in a fresh process (it is never
lifted) that then tries every way the filter closes to signal a protected process: each is
refused with EPERM, the protected process runs on, and the same calls still reach a process
that is not protected (the rank's own children, which the judge's hold and MPI's clean-up
need). Also: a broken job tree, built of real processes, is found and what left it ended."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from d500.distributed import guard

pytestmark = pytest.mark.skipif(sys.platform != "linux" or guard.library() is None,
                                reason="libseccomp (Linux)")

TRY = '''
import ctypes, fcntl, json, os, platform, resource, signal, socket, sys, time
from d500 import children
from d500.distributed import guard

kept, free = int(sys.argv[1]), int(sys.argv[2])
children.confine()  # no_new_privs, as a rank has set before its filter
assert guard.load([kept], [kept])
libc = ctypes.CDLL(None, use_errno=True)
sc = guard.library()


def attempt(what, call):
    try:
        call()
        return "done"
    except PermissionError:
        return "EPERM"
    except OSError as err:
        return type(err).__name__


def raw(name, *args):
    number = name if isinstance(name, int) else sc.resolve_syscall(sc.Arch.NATIVE, name)
    if libc.syscall(ctypes.c_long(number), *map(ctypes.c_long, args)) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


a, b = socket.socketpair()
out = {}
for target in (kept, free):
    out[target] = {
        "kill": attempt("kill", lambda: os.kill(target, signal.SIGSTOP)),
        "tgkill": attempt("tgkill", lambda: raw("tgkill", target, target, signal.SIGSTOP)),
        "tkill": attempt("tkill", lambda: raw("tkill", target, signal.SIGSTOP)),
        "prlimit": attempt("prlimit", lambda: resource.prlimit(target, resource.RLIMIT_CORE,
                                                                (0, 0))),
        "setown": attempt("setown", lambda: fcntl.fcntl(a, fcntl.F_SETOWN, target)),
        "pidfd": attempt("pidfd", lambda: signal.pidfd_send_signal(os.pidfd_open(target),
                                                                    signal.SIGSTOP)),
    }
    os.kill(free, signal.SIGCONT)
out["group"] = {"kill0": attempt("kill", lambda: os.kill(0, signal.SIGCONT)),
                "killpg": attempt("kill", lambda: os.killpg(os.getpgid(kept), signal.SIGCONT)),
                "setown_ex": attempt("fcntl", lambda: fcntl.fcntl(a, 15, b"\\0" * 8)),
                # the pid's high word set: the kernel reads only the low one
                "high": attempt("kill", lambda: raw("kill", (1 << 32) | kept, signal.SIGSTOP)),
                "ioctl": attempt("ioctl", lambda: fcntl.ioctl(a, 0x8902, b"\\0" * 4))}
if platform.machine() == "x86_64":  # x32's getpid: another ABI's number
    out["group"]["x32"] = attempt("x32", lambda: raw(0x40000000 | 39))
print(json.dumps(out))
'''


def test_the_filter_refuses_every_signal_to_a_protected_process(tmp_path):
    kept = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            start_new_session=True)
    free = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        done = subprocess.run([sys.executable, "-c", TRY, str(kept.pid), str(free.pid)],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert set(out[str(kept.pid)].values()) == {"EPERM"}, out
        free_out = out[str(free.pid)]
        assert free_out.pop("pidfd") == "EPERM"  # every pidfd_send_signal (a /proc dir is one)
        assert set(free_out.values()) == {"done"}, out
        assert set(out["group"].values()) == {"EPERM"}, out
        state = open(f"/proc/{kept.pid}/stat").read().rsplit(")", 1)[1].split()[0]
        assert state not in "Tt", state  # never stopped
    finally:
        for p in (kept, free):
            p.kill()
            p.wait()


# A job's tree on one host as hydra and d500.children.keep make it, of real processes: the
# proxy, the waiter it started, the keeper (a subreaper), the rank; the rank, once told, leaves
# a process behind (a double fork: adopted by the keeper)
TREE = '''
import ctypes, os, sys, time
folder = sys.argv[1]


def note(name):
    with open(os.path.join(folder, name + ".new"), "w") as out:
        out.write(str(os.getpid()))
    os.rename(os.path.join(folder, name + ".new"), os.path.join(folder, name))


note("proxy")
if os.fork() == 0:
    note("waiter")
    if os.fork() == 0:
        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER, as a keeper is
        note("keeper")
        if os.fork() == 0:
            note("kept")
            while not os.path.exists(os.path.join(folder, "go")):
                time.sleep(0.01)
            middle = os.fork()
            if middle == 0:
                os.setsid()
                if os.fork() != 0:
                    os._exit(0)
                note("left")
            else:
                os.waitpid(middle, 0)
            while True:
                time.sleep(1)
        while True:
            os.waitpid(-1, 0)
    while True:
        time.sleep(1)
while True:
    try:
        os.waitpid(-1, 0)
    except ChildProcessError:
        time.sleep(0.01)
'''


def _pid(folder, name: str, wait: float = 10) -> int:
    deadline = time.monotonic() + wait
    while not (folder / name).exists():
        assert time.monotonic() < deadline, f"no {name}"
        time.sleep(0.01)
    return int((folder / name).read_text())


def _until(done, wait: float = 5) -> None:
    deadline = time.monotonic() + wait
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)


def _gone(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


@contextlib.contextmanager
def _running_tree(tmp_path):
    """TREE started as rank 1's proxy: (its Popen, the pids of proxy, waiter, keeper, kept);
    every process of it killed afterwards."""
    proxy = subprocess.Popen([sys.executable, "-c", TREE, str(tmp_path)],
                             env={**os.environ, "PMI_RANK": "1"})
    pids: list[int] = []
    try:
        pids += [_pid(tmp_path, n) for n in ("proxy", "waiter", "keeper", "kept")]
        yield proxy, pids
    finally:
        proxy.kill()
        proxy.wait()
        for pid in pids[1:]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_stopped_keeper_and_a_killed_waiter_break_the_tree_and_what_left_it_ends(tmp_path):
    from d500 import children
    from d500.distributed.jobtree import JobTree
    with _running_tree(tmp_path) as (proxy, pids):
        tree = JobTree.found(proxy.pid)
        assert tree is not None and [one.rank for one in tree.ranks] == ["1"]
        (tmp_path / "go").touch()
        pids.append(_pid(tmp_path, "left"))
        while len(children.of(pids[2])) < 2:  # the double fork's middle process gone: `left`
            time.sleep(0.01)  # the keeper's child
        assert tree.broken() == ""
        held = tree.hold()  # the rank and what it left: stopped; the waiter, keeper: not
        assert set(pids[3:]) <= set(held) and not set(pids[:3]) & set(held), (held, pids)
        children.release(held)
        os.kill(pids[2], signal.SIGSTOP)
        _until(lambda: "is stopped" in tree.broken())  # (once the keeper has taken its stop)
        assert tree.broken().startswith(f"rank 1's keeper (pid {pids[2]}) is stopped")
        os.kill(pids[1], signal.SIGKILL)
        _until(lambda: "waiter" in tree.broken())
        assert tree.broken().startswith(f"rank 1's waiter (pid {pids[1]}) was killed")
        tree.end_escaped()
        _until(lambda: all(_gone(p) for p in pids[2:]))
        assert all(_gone(p) for p in pids[2:]), f"{pids[2:]}: some outlived the broken tree"
        assert not _gone(proxy.pid)


def test_a_rank_that_died_is_a_rank_lost_whatever_its_keeper_did_after(tmp_path):
    """A killed rank's keeper and waiter end after it (d500.children.keep), and a judge looking
    then found its tree broken ("rank 1's waiter was killed") and recorded the run failed without
    rank_lost, so it could not resume (test_resume_mpi, once): lost_rank() says it died."""
    from d500.distributed.jobtree import JobTree
    with _running_tree(tmp_path) as (proxy, pids):
        tree = JobTree.found(proxy.pid)
        assert tree is not None and not tree.lost_rank()
        os.kill(pids[2], signal.SIGKILL)  # a keeper gone, its rank alive: an escape, not a loss
        _until(lambda: "keeper" in tree.broken())
        assert tree.broken() and not tree.lost_rank()
        os.kill(pids[3], signal.SIGKILL)
        _until(lambda: _gone(pids[3]))
        assert tree.lost_rank()
