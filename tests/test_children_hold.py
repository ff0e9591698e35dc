"""d500.children.hold stops every process behind a worker's keeper while the judge works off the
clock (a checkpoint, kept models over d500.training.heldout.LIMIT). An entry's process that forks
the next and ends, again and again, is never where the judge read it last: a chain of processes,
each moving under the keeper (or its namespace's pid 1) as its parent ends. Read once and
stopped, the tree held the pids read, while the chain's newest ran on, off the clock. The
attack, performed behind a real keeper (children.keep): the chain counts its generations in a
shared file, which must not move while it is held; and a process that may not be stopped fails
the hold with its line (d500.children.Unheld), what was stopped let go."""

from __future__ import annotations

import mmap
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from d500 import children

# Behind a keeper: a chain of processes, each forking the next and ending at once, each counting
# its generation in the file's first 8 bytes (shared: every generation maps it).
CHAIN = '''
import mmap, os, struct, sys, time
from d500 import children
children.keep()  # (returns in the kept process: the entry's, which waits; its child forks)
with open(sys.argv[1], "r+b") as f:
    shared = mmap.mmap(f.fileno(), 8)
if os.fork():
    while True:
        time.sleep(1)
while True:
    if os.fork():
        os._exit(0)
    shared[:8] = struct.pack("q", struct.unpack("q", shared[:8])[0] + 1)
'''

linux = pytest.mark.skipif(sys.platform != "linux", reason="/proc and SIGSTOP")


def _count(shared: mmap.mmap) -> int:
    return struct.unpack("q", shared[:8])[0]


@linux
def test_a_chain_of_forks_is_held_whole(tmp_path):
    counter = tmp_path / "count"
    counter.write_bytes(bytes(8))
    root = Path(__file__).resolve().parents[1]
    keeper = subprocess.Popen([sys.executable, "-c", CHAIN, str(counter)], cwd=root,
                              env={**os.environ, "PYTHONPATH": str(root)})
    held: list[int] = []
    try:
        with open(counter, "r+b") as f:
            shared = mmap.mmap(f.fileno(), 8)
        deadline = time.monotonic() + 60
        while _count(shared) < 200:  # the chain runs
            assert keeper.poll() is None and time.monotonic() < deadline, "no chain"
            time.sleep(0.01)
        for _ in range(10):  # each hold a fresh race with the chain
            held = children.hold(keeper.pid)
            before = _count(shared)
            time.sleep(0.02)
            moved = _count(shared) - before
            running = [p for p in children._descendants(keeper.pid) if not children._stopped(p)]
            assert moved == 0 and not running, (
                f"held {held}, yet the chain made {moved} generation(s); running: {running}")
            children.release(held)
            held = []
            time.sleep(0.01)
    finally:
        _end(keeper, held)


def _end(keeper: subprocess.Popen, also: list[int] = ()) -> None:
    """SIGKILL all behind `keeper`, held first (a chain running would outlive a kill of the pids
    read once), then it."""
    try:
        stopped = children.hold(keeper.pid)
    except children.Unheld:
        stopped = []
    for pid in [*also, *stopped, *children._descendants(keeper.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    keeper.kill()
    keeper.wait()


def _started(code: str) -> tuple[subprocess.Popen, list[int]]:
    """A process running `code`, once it has started children: it, and the pids behind it."""
    keeper = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 30
    while len(children._descendants(keeper.pid)) < 2:
        assert keeper.poll() is None and time.monotonic() < deadline, "no children"
        time.sleep(0.01)
    return keeper, children._descendants(keeper.pid)


# A process whose child waits for its own vfork child (how Python's subprocess starts a
# program): that parent waits uninterruptibly ("D") as long as its child is stopped.
VFORK = """import ctypes, os, time
if os.fork() == 0:
    libc = ctypes.CDLL(None)
    if libc.vfork() == 0:
        libc.sleep(60)
        libc._exit(0)
time.sleep(60)"""


@linux
def test_a_parent_waiting_for_its_vfork_child_is_held():
    keeper, behind = _started(VFORK)
    held: list[int] = []
    try:
        held = children.hold(keeper.pid)
        assert sorted(held) == sorted(behind)
        states = {p: Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
                  for p in behind}
        assert sorted(states.values()) == ["D", "T"], states
    finally:
        _end(keeper, held)


@linux
def test_a_process_that_does_not_stop_fails_the_hold_and_all_is_let_go(monkeypatch):
    """A thread that never reads stopped (none can be made to: the look that reads it stands in
    for one): the hold ends in its line within its deadline, what it stopped let go."""
    keeper, behind = _started(VFORK.replace("libc.vfork()", "os.fork()"))
    try:
        child = behind[-1]
        real = children._stopped
        monkeypatch.setattr(children, "_stopped", lambda pid: pid != child and real(pid))
        t = time.monotonic()
        with pytest.raises(children.Unheld, match=f"process {child} behind the worker did not "
                                                  "stop within 0.2 s of SIGSTOP"):
            children.hold(keeper.pid, deadline=0.2)
        assert time.monotonic() - t < 5
        monkeypatch.undo()
        time.sleep(0.05)
        assert not any(children._stopped(p) for p in behind)  # SIGCONT: running on
    finally:
        _end(keeper)
