"""A level-3 rank's entry code sees the results directory ($D500_HOME) covered as a level-2
worker's does (d500.children._hide_home: the entries' cache, writable, and the entry's own folder,
read-only; not the ledger, the MLLOGs, the checkpoints nor the judges' caches), while rank 0's
judges, which write there, see all of it.

    helper = cover.start(entry_folder)  # each rank, once kept, before it confines itself
    ... judges spawned ...              # rank 0: by the helper (d500.distributed.judge.Judge)
    cover.cover()                       # each rank, before any of the entry's code runs in it

A process inherits its parent's mounts, and a confined rank may mount nothing, so before it
confines itself each rank forks a helper that keeps the rank's first mount namespace (d500's code
read-only, d500.children._code_read_only; the results directory seen) and its capabilities, then
moves itself into a namespace of its own, as yet the same. Rank 0's judges are the helper's
children, started in the first namespace; once they are, the helper covers the rank's namespace
(a child of it enters that namespace and mounts the cover), drops every capability, and answers
nothing more: the entry's code, which could write to its socket, runs only after. Where the
kernel permits no mount namespace (not root), there is no helper: the judges are the rank's
children, and a rank's code reads and writes the results directory as its user may (README).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
from pathlib import Path
from typing import Any

_helper: Helper | None = None
NEWNS = 0x00020000


class Helper:
    """The rank's end of its helper's socket."""

    def __init__(self, sock: socket.socket, pid: int, shown: list[str]):
        self.sock, self.pid, self.shown, self.covered = sock, pid, shown, False
        self.judges = 0

    def spawn(self, conn: Any, lost: Any) -> Started:
        """A judge process (d500.distributed.judge.main) started by the helper, outside the
        cover, with this process's environment, given the child ends of its two pipes."""
        from d500.errors import D500Error
        if self.covered:
            raise D500Error("no judge is started once the rank's $D500_HOME is covered")
        try:
            _send(self.sock, {"spawn": dict(os.environ)}, [conn.fileno(), lost.fileno()])
            answer, fds = _receive(self.sock)
        except OSError as err:
            answer, fds = {"error": str(err)}, []
        if "pid" not in answer or len(fds) != 1:
            raise D500Error(f"the rank's helper started no judge process "
                            f"({answer.get('error', 'it ended')})")
        self.judges += 1
        return Started(int(answer["pid"]), fds[0])

    def cover(self) -> bool:
        """Cover this rank's results directory; whether it was. The helper then drops its
        capabilities and answers no more."""
        self.covered = True
        ns = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _send(self.sock, {"cover": self.shown}, [ns])
            answer, _ = _receive(self.sock)
        except OSError:
            return False
        finally:
            os.close(ns)
        if not self.judges:  # (a rank but rank 0: its helper's work is done)
            self.close()
        return answer.get("covered") is True

    def close(self) -> None:
        """Let the helper go (it ends at EOF, or once its judges end) and reap it."""
        self.covered = True
        self.sock.close()
        if not self.judges:
            os.waitpid(self.pid, 0)


class Started:
    """A judge started by the helper, as multiprocessing.Process reads to its parent: its pid and
    a pidfd (readable once it ended); its exit code is its parent's, the helper's (None here)."""

    exitcode = None

    def __init__(self, pid: int, pidfd: int):
        self.pid, self.pidfd = pid, pidfd

    def join(self, timeout: float | None = None) -> None:
        select.select([self.pidfd], [], [], timeout)

    def is_alive(self) -> bool:
        return not select.select([self.pidfd], [], [], 0)[0]

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        if self.is_alive():  # (not yet reaped by the helper: its pid is its own)
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass


def start(entry: str | os.PathLike[str]) -> Helper | None:
    """In a rank kept by d500.children.keep(forward=True), before it confines itself: fork the
    helper, then move into a mount namespace of its own; the helper (also `helper()`), or None
    where the kernel refused that namespace (then nothing is covered). `entry`: the entry's
    folder or file, read again after the cover (its optimizer file is imported then)."""
    global _helper
    import ctypes
    if sys.platform != "linux":
        return None
    path = Path(entry).expanduser().absolute()
    shown = [str(path if path.is_dir() else path.parent)]
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    rank = os.getpid()
    pid = os.fork()
    if pid == 0:  # the helper
        ours.close()
        code = 1
        try:
            code = _serve(theirs, rank)
        finally:
            os._exit(code)
    theirs.close()
    libc = ctypes.CDLL(None, use_errno=True)
    rec, slave = 0x4000, 0x80000
    if libc.unshare(NEWNS) != 0 or libc.mount(None, b"/", None, rec | slave, None) != 0:
        ours.close()  # (the helper ends at EOF)
        os.waitpid(pid, 0)
        return None
    _helper = Helper(ours, pid, shown)
    return _helper


def helper() -> Helper | None:
    """This rank's helper while it may still start judges (before the cover), else None."""
    return _helper if _helper is not None and not _helper.covered else None


def cover() -> bool:
    """Cover this rank's results directory (its helper's work), the rank's own caches moved into
    the entries' cache (d500.paths.cache); whether it was covered (False without a helper)."""
    if _helper is None or _helper.covered:
        return False
    from d500 import children
    from d500.paths import enter_entry_cache
    done = _helper.cover()
    for path in children.writable() if done else []:
        enter_entry_cache(path)
    children.reenter()  # (a working directory in the results directory: under the cover)
    if not done and os.environ.get("D500_DEBUG") == "1":
        print("d500: debug: this rank's results directory was not covered (a mount refused): "
              "its entry's code reads and writes it", file=sys.stderr)
    return done


def close() -> None:
    """No cover follows (a level-2 workload under mpiexec): the helper ends."""
    if _helper is not None and not _helper.covered:
        _helper.close()


def _serve(sock: socket.socket, rank: int) -> int:
    """The helper of process `rank`: start judges while asked, then cover the rank and, its
    capabilities dropped, wait (answering nothing) until the rank is gone; then its judges."""
    from d500 import children
    children._die_with_parent(ignore_interrupt=True)
    if os.getppid() != rank:  # it died before the line above
        return 1
    children.shield()
    keep = sock.fileno()
    os.closerange(3, keep)
    os.closerange(keep + 1, children._max_fd())
    started: list[Any] = []
    while True:
        try:
            asked, fds = _receive(sock)
        except (OSError, ValueError):
            break
        if not asked:
            break
        if "spawn" in asked and len(fds) == 2:
            _send(sock, *_spawn(asked["spawn"], fds, started))
        elif "cover" in asked and len(fds) == 1:
            done = _cover_in(fds[0], asked["cover"])
            os.close(fds[0])
            children.confine()
            _send(sock, {"covered": done}, [])
            while sock.recv(4096):  # nothing more is read: the entry's code may write here
                pass
            break
        else:
            for fd in fds:
                os.close(fd)
            break
    for process in started:
        process.join()
    return 0


def _spawn(env: dict[str, str], fds: list[int], started: list[Any]
           ) -> tuple[dict[str, Any], list[int]]:
    """Start a judge process given its pipes' ends, with the rank's environment."""
    import multiprocessing
    from multiprocessing.connection import Connection

    from d500.distributed.judge import main
    os.environ.clear()
    os.environ.update(env)
    ctx = multiprocessing.get_context("spawn")
    conn, lost = Connection(fds[0]), Connection(fds[1])
    process = ctx.Process(target=main, args=(conn, lost), name="d500-judge", daemon=True)
    try:
        process.start()
    except OSError as err:
        return {"error": str(err)}, []
    finally:
        conn.close()
        lost.close()
    started.append(process)
    pidfd = os.pidfd_open(process.pid)
    return {"pid": process.pid}, [pidfd]


def _cover_in(ns: int, shown: list[str]) -> bool:
    """In a child that enters the rank's mount namespace `ns`: the results directory covered
    (d500.children._hide_home), the entries' cache bound back writable, `shown` read-only."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if _covered(ns, shown) else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _covered(ns: int, shown: list[str]) -> bool:
    import ctypes

    from d500 import children
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(ns, NEWNS) != 0:
        return False
    skeleton = children._skeleton(shown)
    if skeleton is None:  # no results directory yet, or one holding d500's code: nothing hidden
        return False
    view = children.viewer(libc)
    if not children._hide_home(libc, skeleton, view):
        return False
    seen = [os.path.realpath(p) for p in shown]
    return all(view(p, 0x1, again=False) for p in skeleton[1]  # MS_RDONLY
               if any(children._under(p, s) for s in seen))


def _send(sock: socket.socket, message: dict[str, Any], fds: list[int]) -> None:
    data = json.dumps(message).encode()
    socket.send_fds(sock, [len(data).to_bytes(4, "little") + data], fds)


def _receive(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One message and the descriptors sent with it ({} at EOF)."""
    head, fds, _, _ = socket.recv_fds(sock, 4, 4)
    for fd in fds:
        os.set_inheritable(fd, False)
    if not head:
        return {}, fds
    while len(head) < 4:
        part = sock.recv(4 - len(head))
        if not part:
            raise OSError("the helper's socket closed mid-message")
        head += part
    size, data = int.from_bytes(head, "little"), b""
    while len(data) < size:
        part = sock.recv(size - len(data))
        if not part:
            raise OSError("the helper's socket closed mid-message")
        data += part
    return json.loads(data), fds
