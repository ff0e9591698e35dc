"""d500.distributed.faults without MPI: a rank that ends the job waits until its launcher has read
its last line from the output pipe (hydra could end the job with the line still in the pipe,
and the one-line error never showed: 3 of 60 aborted 2-rank jobs here)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import sys, time
from d500.distributed import faults
print("x" * 1000 + " the last line", file=sys.stderr)
read = faults.wait_until_read(float(sys.argv[1]))
print(read, time.monotonic(), flush=True)
"""


def start(limit: float, out: Path, stderr: int | object) -> subprocess.Popen:
    """The child above, its stdout to `out` (a file, never waited for), its stderr `stderr`."""
    with out.open("w") as stdout:
        return subprocess.Popen([sys.executable, "-c", CHILD, str(limit)], cwd=ROOT,
                                stdout=stdout, stderr=stderr)


def test_the_line_is_read_before_the_wait_ends(tmp_path):
    out = tmp_path / "out.txt"
    proc = start(60, out, subprocess.PIPE)
    try:
        ready, _, _ = select.select([proc.stderr], [], [], 120)  # the line is in the pipe
        assert ready, "the child wrote nothing"
        time.sleep(0.3)  # (the child keeps waiting however long the reader takes)
        reading = time.monotonic()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
        proc.stderr.close()
    read, returned = out.read_text().split()
    assert err.endswith(" the last line\n")
    assert read == "True" and float(returned) >= reading  # it returned after the read began


def test_a_reader_that_never_reads_is_given_up_after_the_limit(tmp_path):
    out = tmp_path / "out.txt"
    r, w = os.pipe()
    try:
        proc = start(0.3, out, w)
        os.close(w)
        w = -1
        assert proc.wait(timeout=120) == 0  # nothing read the pipe meanwhile
        assert out.read_text().split()[0] == "False"
        assert os.read(r, 2000).endswith(b" the last line\n")
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def test_output_to_a_file_is_not_waited_for(tmp_path):
    out = tmp_path / "out.txt"
    with (tmp_path / "err.txt").open("w") as err:
        proc = start(60, out, err)
    assert proc.wait(timeout=120) == 0
    assert out.read_text().split()[0] == "True"
    assert (tmp_path / "err.txt").read_text().endswith(" the last line\n")


def test_rank_0_names_a_peer_that_died_behind_its_own_error():
    """A killed peer can surface first as rank 0's own error (torch's gloo: connection reset
    by peer), before a heartbeat is missed; rank 0 then looks for a dead peer on its host
    (Watchdog.peer_gone) so the run is recorded a lost rank's, resumable. A live peer: '' after
    the wait; a SIGKILLed one (a zombie until reaped, as a rank is before hydra reaps it): named.
    (The watchdog object without its MPI side: peer_gone reads only the peers' identities.)"""
    from d500.distributed.faults import Watchdog, identity
    from d500.ledger.liveness import _proc_stat
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        watchdog = Watchdog.__new__(Watchdog)
        watchdog.peers = [identity(), {**identity(), "pid": child.pid,
                                       "proc_start": _proc_stat(child.pid)[1]}]
        watchdog.size = 2
        start = time.monotonic()
        assert watchdog.peer_gone(wait=0.2) == ""
        assert time.monotonic() - start >= 0.2
        child.kill()
        why = watchdog.peer_gone(wait=5)
        assert why.startswith(f"rank 1 (pid {child.pid} on ") and "died" in why, why
    finally:
        child.kill()
        child.wait()
