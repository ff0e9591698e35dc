"""Faults in a level-3 run: a watchdog thread per rank, so that a rank that dies or stops never
leaves the others waiting in a collective forever, and the run is recorded failed naming it.

    watchdog = Watchdog(comm.mpi, limit=10.0, on_lost=record_failed)   # every rank, collectively
    with watchdog:
        ... training; a failing rank calls watchdog.fail(text) before it leaves ...

Every rank's watchdog thread sends a heartbeat to rank 0 every `beat` seconds on its own duplicate
of the communicator (never the one the training's collectives use) and rank 0's answers every
worker; a heartbeat is a small nonblocking message, so a main thread blocked in an Allreduce
does not stop it. Rank 0 decides a worker is lost when:

- its process is gone (a rank on rank 0's host: /proc shows it dead, found within a beat), or
- it sent nothing for `limit` seconds (a rank elsewhere, or a stopped process), or
- it sent FAIL with one line (an exception on that rank only: it cannot raise alone, the others
  would wait for it in the next collective).

Then rank 0 calls `on_lost(why, gone)` (the trainer records the run `failed` with `why`, naming
the rank; `gone`: its process died or went silent, not its code failed, so that the run can be
resumed from its last checkpoint, d500.training.resume), prints one line and calls MPI_Abort,
which ends every rank. A worker that stops hearing from rank 0 (dead, or its own host gone)
prints one line and aborts the job itself.

What a launcher does first matters (measured with MPICH 5.0's hydra): by default mpiexec
SIGKILLs every other rank, rank 0 included, as soon as one rank dies of a signal, before any
watchdog can act: the run's ledger row is then left `running` by a dead writer, which every
reader shows as `interrupted` (the ledger's liveness check) and the next writer seals so. Under
`mpiexec -disable-auto-cleanup` (what `d500 run` uses) hydra instead sends SIGUSR1 to the
survivors (whose default action would end them silently: the watchdog catches it) and leaves
them running; the watchdog then ends the job and the run is recorded failed naming the rank,
within a beat (same host) or `limit` seconds. hydra sends that SIGUSR1 when any rank exits, the
last ones of a job that went well included: `ignore_launcher_notices()` (the level-3 command, at
its start) makes it harmless outside runs, even during the interpreter's shutdown.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import os
import signal
import socket
import stat
import sys
import termios
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn, Self

from d500.errors import D500Error
from d500.say import say

BEAT, FAIL = 21, 22  # tags on the watchdog's own communicator
DEFAULT_LIMIT = 10.0  # seconds of silence before a rank is given up (D500_MPI_TIMEOUT)
POLL = 0.05  # seconds between the watchdog thread's polls
DRAIN_WAIT = 5.0  # seconds an aborting rank waits for the launcher to read its last lines


class RankLost(D500Error):
    """A rank died, stopped answering or failed alone; the job is ended."""

    exit_code = 1


def limit() -> float:
    """Seconds a rank may stay silent before it is given up: D500_MPI_TIMEOUT, default 10 (a
    killed rank on the same host is found within a beat, whatever the limit)."""
    from d500.distributed.launch import silence_limit
    return silence_limit(DEFAULT_LIMIT)


def ignore_launcher_notices() -> None:
    """Ignore hydra's SIGUSR1 (a rank exited) in this process from now on, except while a
    Watchdog runs; an ignored signal stays ignored through Python's shutdown, when a handler
    would be reset to the default action (which ends the process)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def unread(fd: int) -> int:
    """Bytes written to `fd` that its reader has not taken yet, when it is a pipe (the way an
    MPI launcher reads a rank's output); 0 for anything else."""
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return 0
        count = array.array("i", [0])
        fcntl.ioctl(fd, termios.FIONREAD, count)
        return count[0]
    except OSError:
        return 0


def wait_until_read(limit: float = DRAIN_WAIT) -> bool:
    """Flush stdout and stderr and wait (at most `limit` seconds) until whoever reads their pipes
    has taken everything written; whether it has."""
    sys.stdout.flush()
    sys.stderr.flush()
    deadline = time.monotonic() + limit
    while unread(1) or unread(2):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.001)
    return True


def end_job(mpi: Any, line: str, code: int) -> NoReturn:
    """`line` on stderr (whole, rank-prefixed: d500.say), then MPI_Abort(code) of the whole job
    on `mpi`. hydra can end the job before its proxy has read what is still in a rank's output
    pipe, losing that line (3 of 60 aborts of a 2-rank job here), so the abort waits until the
    line has been read; MPICH's own line about the abort is not printed."""
    say(line)
    wait_until_read()
    with contextlib.suppress(OSError):  # (MPICH's 'Abort(130) on node 1 (rank 1 in comm 0):
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # application called MPI_Abort...')
    mpi.Abort(code)
    os._exit(code)  # MPICH's Abort may return before the launcher ends this process


def identity() -> dict[str, Any]:
    """This process as the watchdog names it: host, pid and what tells its pid from a reused one."""
    from d500.ledger.liveness import process_identity
    return process_identity()


def _gap(now: float, last: float, beat: float) -> float:
    """Seconds this thread did not run since its last turn (at `last`, 0: none yet), when more
    than a `beat` beyond its poll: its process was stopped (level 3's judge stops every rank
    while it measures test accuracy, d500.distributed.jobtree) or starved. Its peers' silence
    counts from when it runs again: they were stopped with it."""
    gap = now - last - POLL if last else 0.0
    return gap if gap > beat else 0.0


class Watchdog:
    """Heartbeats between rank 0 and every other rank on a duplicated communicator; see the
    module docstring. Construct it on every rank at the same point (it duplicates `mpi` and
    gathers every rank's process identity: collectives)."""

    def __init__(self, mpi: Any, limit: float = DEFAULT_LIMIT,
                 on_lost: Callable[[str, bool], None] | None = None,
                 beat: float | None = None):
        self.mpi = mpi.Dup()
        self.rank, self.size = self.mpi.Get_rank(), self.mpi.Get_size()
        self.limit = float(limit)
        self.beat = beat if beat is not None else min(1.0, self.limit / 5)
        self.on_lost = on_lost
        self.peers: list[dict[str, Any]] = self.mpi.allgather(identity())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="d500-watchdog", daemon=True)
        self._sends: list[Any] = []
        self.lost: str | None = None
        self.notified = 0.0  # when the launcher last signalled a failure (SIGUSR1), or 0
        self._previous: Any = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGUSR1, self._notified)
            signal.siginterrupt(signal.SIGUSR1, False)  # SA_RESTART: MPI's calls carry on

    def _notified(self, signum: int, frame: Any) -> None:
        """hydra's SIGUSR1 (a rank died): survive it; the watchdog thread finds which rank."""
        self.notified = time.monotonic()

    # ------------------------------------------------------------------ use
    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """End the heartbeats (every rank at the end of the run; messages in flight drained) and
        give SIGUSR1 back its previous handling."""
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
        self._drain()
        if self._previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, self._previous)
            self._previous = None

    def describe(self, rank: int) -> str:
        peer = self.peers[rank]
        return f"rank {rank} (pid {peer['pid']} on {peer['host']})"

    def fail(self, text: str, wait: float | None = None) -> None:
        """On a worker whose own code failed: tell rank 0 (which records the run failed and
        ends the job), then wait for that; abort the job itself if rank 0 does not within
        `wait` seconds. On rank 0 the caller records the failure itself."""
        if self.rank == 0:
            return
        self._sends.append(self.mpi.isend(text, dest=0, tag=FAIL))
        deadline = time.monotonic() + (self.limit if wait is None else wait)
        while time.monotonic() < deadline:
            time.sleep(POLL)  # rank 0 aborts the job: this process is killed while it sleeps
        self.abort(f"rank 0 did not end the job within {self.limit:g} s after this rank "
                   f"failed: {text}", 1)

    def peer_gone(self, wait: float = 1.0) -> str:
        """On rank 0, after its own code failed: why a worker on this host is known dead,
        waiting up to `wait` s for its process to be gone, or ''. A peer's death can surface
        first as rank 0's own error (torch's gloo: the dead peer's connection reset), before
        any heartbeat is missed; the run is then a lost rank's (resumable), not rank 0's."""
        deadline = time.monotonic() + wait
        while True:
            why = self._dead_here(list(range(1, self.size)))
            if why or time.monotonic() >= deadline:
                return why
            time.sleep(POLL)

    def abort(self, text: str, code: int = 1) -> None:
        """One line on stderr, then MPI_Abort of the whole job (every rank ends)."""
        where = f"d500 (rank {self.rank} of {self.size} on {socket.gethostname()})"
        end_job(self.mpi, f"{where}: error: {text}", code)

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        try:
            if self.rank == 0:
                self._watch_workers()
            else:
                self._watch_root()
        except BaseException as err:  # noqa: BLE001 - a broken watchdog must not pass silently
            self.abort(f"the watchdog failed: {type(err).__name__}: {err}")

    def _send_beats(self, targets: list[int]) -> None:
        self._sends = [s for s in self._sends if not s.Test()]
        for r in targets:
            self._sends.append(self.mpi.isend(None, dest=r, tag=BEAT))

    def _watch_workers(self) -> None:
        from mpi4py import MPI
        workers = list(range(1, self.size))
        heard = dict.fromkeys(workers, time.monotonic())
        status = MPI.Status()
        next_beat = last = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            gap, last = _gap(now, last, self.beat), now
            heard = {r: t + gap for r, t in heard.items()}
            if now >= next_beat:
                self._send_beats(workers)
                next_beat = now + self.beat
                why = self._dead_here(workers)
                if why:
                    return self._lose(why, gone=True)
            while (message := self.mpi.improbe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG,
                                               status=status)) is not None:
                data = message.recv()
                source = status.Get_source()
                heard[source] = time.monotonic()
                if status.Get_tag() == FAIL:
                    return self._lose(f"{self.describe(source)} failed: {data}")
            silent = [r for r in workers if time.monotonic() - heard[r] > self.limit]
            if silent:
                return self._lose(f"{self.describe(silent[0])} sent nothing for "
                                  f"{self.limit:g} s: it died or stopped", gone=True)
            self._stop.wait(POLL)

    def _watch_root(self) -> None:
        heard = time.monotonic()
        next_beat = last = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            gap, last = _gap(now, last, self.beat), now
            heard += gap
            if now >= next_beat:
                self._send_beats([0])
                next_beat = now + self.beat
                if self._dead_here([0]):
                    self.abort(f"{self.describe(0)} died; ending the job")
            while self.mpi.iprobe(source=0, tag=BEAT):
                self.mpi.recv(source=0, tag=BEAT)
                heard = time.monotonic()
            if time.monotonic() - heard > self.limit:
                self.abort(f"{self.describe(0)} sent nothing for {self.limit:g} s; ending the "
                           f"job")
            self._stop.wait(POLL)

    def _dead_here(self, ranks: list[int]) -> str:
        """Why one of `ranks` on this host is known dead (its process gone), or ''."""
        from d500.ledger.liveness import process_alive
        for r in ranks:
            p = self.peers[r]
            if process_alive(p["pid"], p["host"], p["boot_id"], p["proc_start"]) is False:
                return f"{self.describe(r)} died (its process is gone)"
        return ""

    def _lose(self, why: str, gone: bool = False) -> None:
        self.lost = why
        if self.on_lost is not None:
            try:
                self.on_lost(why, gone)
            except BaseException as err:  # noqa: BLE001 - the job must still end
                say(f"d500: could not record the lost rank: {err}")
        self.abort(why)

    def _drain(self) -> None:
        """Wait (a little) for this rank's own heartbeats to leave."""
        deadline = time.monotonic() + self.limit
        while self._sends and time.monotonic() < deadline:
            self._sends = [s for s in self._sends if not s.Test()]
            time.sleep(0.001)

    def close(self) -> None:
        """Every rank, at the end of a run that went well: stop, then a barrier, then take the
        heartbeats still addressed to this rank, so nothing is pending when MPI finalizes."""
        self.stop()
        self.mpi.Barrier()
        while self.mpi.iprobe(tag=BEAT):
            self.mpi.recv(tag=BEAT)
        self.mpi.Free()
