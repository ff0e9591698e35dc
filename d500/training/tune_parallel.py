"""Tuning trials shared among MPI ranks (`mpiexec -n K d500 tune ...`): rank 0 reads and writes
the ledger, hands out trials one at a time, and trains too; the other ranks train through a Relay
and send each finished run's record to rank 0, which imports it. Nothing else touches the ledger,
so ranks on other machines need no access to rank 0's SQLite file.

Assignment is dynamic (trial times differ by several times between trial points): a rank that
is free asks rank 0 for the next pending trial, in study-major order, and rank 0's own main
thread takes from the same queue. A dispatcher thread on rank 0 answers at once, polling with
short sleeps (MPICH's blocking receive would spin a core the trials need). Messages, all small
pickled dicts, on COMM_WORLD:

    worker -> 0  READY   {"record": the last trial's relay record, or None}
    0 -> worker  ASSIGN  {"trial": Trial fields, "study_id": int, "group": str}, or None: stop
    worker -> 0  BEAT    None, every LIMIT/6 s while the worker trains

A rank silent for LIMIT seconds (D500_MPI_TIMEOUT, default 120) while it holds a trial, or that
never asks, is given up: no trial is handed out any more, the trials running elsewhere finish and
are recorded, and rank 0 then ends with RankLost, on which the CLI calls MPI_Abort (MPICH's
mpiexec already ends the job when a rank is killed; this covers launchers that do not). A worker
that hears nothing from rank 0 for LIMIT seconds ends the same way. Trials not recorded (held by
a lost rank, or running when the job was aborted) run again when the command is run again.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Self

from d500.distributed.launch import (  # noqa: F401  (re-exported: tune_cli, tests)
    LAUNCHER_VARIABLES,
    LOCAL_SIZE_VARIABLES,
    launched_by_mpi,
    share_cores,
    world,
)
from d500.errors import D500Error

if TYPE_CHECKING:  # imported when used: launched_by_mpi and share_cores run before NumPy loads
    from d500.training.trainer import Progress
    from d500.training.tuning import Trial, TuneReport

READY, ASSIGN, BEAT = 1, 2, 3
POLL = 0.01  # seconds between polls of a waiting rank
DEFAULT_LIMIT = 120.0
_world: Any = None  # COMM_WORLD once this process takes part in a parallel tuning


class RankLost(D500Error):
    """A rank stopped answering; the job ends so that no rank waits for it forever."""

    exit_code = 1


def running_world() -> Any:
    """The COMM_WORLD of a parallel tuning in progress in this process, or None."""
    return _world


def limit() -> float:
    """Seconds a rank may stay silent before it is given up (D500_MPI_TIMEOUT)."""
    from d500.distributed.launch import silence_limit
    return silence_limit(DEFAULT_LIMIT)


def tune(workload: Any, submission: Any, backend: str, *, studies: int, trials: int,
         ledger: Any = None, data_dir: str | None = None,
         on_trial: Callable[[Trial], Progress | None] | None = None) -> TuneReport | None:
    """d500.training.tuning.tune, with the trials shared among the ranks when MPI launched more
    than one; rank 0 returns the report, other ranks None. Every rank checks the input (the
    same way, so all fail alike) before any MPI communication."""
    from d500.training.trainer import preflight
    from d500.training.tuning import plan
    from d500.training.tuning import tune as tune_here

    silence = limit() if launched_by_mpi() else DEFAULT_LIMIT
    plan(workload, submission, studies, trials)
    preflight(workload, submission.recipe, backend, data_dir)
    global _world
    comm = _world = world()
    if comm is None:
        return tune_here(workload, submission, backend, studies=studies, trials=trials,
                         ledger=ledger, data_dir=data_dir, on_trial=on_trial)
    if comm.Get_rank() != 0:
        _work(comm, workload, submission, backend, data_dir, silence)
        return None
    return _coordinate(comm, workload, submission, backend, studies, trials, ledger, data_dir,
                       on_trial, silence)


# ------------------------------------------------------------------ rank 0
class _Board:
    """What rank 0's two threads share: the pending trials, the records received, the ranks
    given up and a failure of the dispatcher."""

    def __init__(self, pending: list[Trial]):
        self._lock = threading.Lock()
        self._pending = collections.deque(pending)
        self._received: list[tuple[int, Trial, dict[str, Any]]] = []
        self.lost: dict[int, str] = {}  # rank -> why it was given up
        self.error: BaseException | None = None

    def take(self) -> Trial | None:
        with self._lock:
            return self._pending.popleft() if self._pending else None

    def close(self) -> None:
        """Hand out no more trials."""
        with self._lock:
            self._pending.clear()

    def deliver(self, rank: int, trial: Trial, record: dict[str, Any]) -> None:
        with self._lock:
            self._received.append((rank, trial, record))

    def received(self) -> list[tuple[int, Trial, dict[str, Any]]]:
        with self._lock:
            out, self._received = self._received, []
        return out


class _Dispatcher(threading.Thread):
    """Rank 0's answering thread: the only one on rank 0 that calls MPI while trials run."""

    def __init__(self, comm: Any, board: _Board, study_ids: list[int], group: str,
                 silence: float):
        super().__init__(name="d500-tune-dispatcher", daemon=True)
        self.comm, self.board, self.study_ids = comm, board, study_ids
        self.group, self.silence = group, silence

    def run(self) -> None:
        try:
            self._serve()
        except BaseException as err:  # noqa: BLE001 - handed to the main thread, which raises
            self.board.error = err
            self.board.close()

    def _serve(self) -> None:
        from mpi4py import MPI

        comm, board = self.comm, self.board
        workers = set(range(1, comm.Get_size()))
        heard = dict.fromkeys(workers, time.monotonic())
        holding: dict[int, Trial] = {}
        done: set[int] = set()
        sends: list[Any] = []
        status = MPI.Status()
        while done | set(board.lost) != workers:
            message = comm.improbe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status)
            if message is None:
                self._give_up_silent(workers - done, heard, holding)
                sends = [s for s in sends if not s.Test()]
                time.sleep(POLL)
                continue
            data = message.recv()
            rank, tag = status.Get_source(), status.Get_tag()
            heard[rank] = time.monotonic()
            if tag != READY or rank in done:
                continue
            if data.get("record") is not None and rank in holding:
                board.deliver(rank, holding.pop(rank), data["record"])
            trial = board.take()
            job = None if trial is None else {
                "trial": dataclasses.asdict(trial), "study_id": self.study_ids[trial.study],
                "group": self.group}
            sends.append(comm.isend(job, dest=rank, tag=ASSIGN))
            if trial is None:
                done.add(rank)
            else:
                holding[rank] = trial
        _wait(sends, self.silence, "rank 0's last answers")

    def _give_up_silent(self, waiting: set[int], heard: dict[int, float],
                        holding: dict[int, Trial]) -> None:
        from d500.ledger.lifecycle import trial_label
        now = time.monotonic()
        for rank in sorted(waiting - set(self.board.lost)):
            if now - heard[rank] > self.silence:
                trial = holding.pop(rank, None)
                doing = (f"while running {trial_label(trial.study, trial.number)}"
                         if trial else "before asking for a trial")
                self.board.lost[rank] = (f"rank {rank} sent nothing for {self.silence:g} s "
                                         f"{doing}")
                self.board.close()


def _coordinate(comm: Any, workload: Any, submission: Any, backend: str, studies: int,
                trials: int, ledger: Any, data_dir: str | None, on_trial: Any,
                silence: float) -> TuneReport:
    from d500.ledger import Ledger, iso
    from d500.training.trainer import Result
    from d500.training.tuning import TuneReport, open_studies, plan, run_trial

    size = comm.Get_size()
    group = f"tune {iso(time.time())} {socket.gethostname()}:{os.getpid()}"
    report = TuneReport(world_size=size)
    try:
        ledger = ledger if ledger is not None else Ledger()
        schedule = plan(workload, submission, studies, trials)
        opened = open_studies(ledger, workload, submission, backend, studies, trials)
    except BaseException:
        _release(comm, silence)  # every worker told to stop, then the error shows on rank 0
        raise
    pending = []
    for study_trials, o in zip(schedule, opened):
        report.studies.append(o.study.id)
        for trial in study_trials:
            if trial.number in o.done:
                report.kept.append((trial, o.done[trial.number]))
            else:
                pending.append(trial)
    board = _Board(pending)
    dispatcher = _Dispatcher(comm, board, report.studies, group, silence)
    dispatcher.start()

    def collect() -> None:
        for rank, trial, record in board.received():
            run_id = ledger.import_run(record)
            report.ran.append((trial, Result(run_id, record["status"], record["figures"],
                                             record["error"] or "")))
            report.ranks[(trial.study, trial.number)] = rank

    try:
        while (trial := board.take()) is not None:
            collect()
            progress: Progress | None = on_trial(trial) if on_trial else None
            result = run_trial(workload, submission, backend, trial, opened[trial.study].study,
                               ledger=ledger, data_dir=data_dir, progress=progress,
                               run_kwargs={"group": group, "rank": 0, "world_size": size})
            report.ran.append((trial, result))
            report.ranks[(trial.study, trial.number)] = 0
            if board.error is not None:
                raise board.error
        while dispatcher.is_alive():
            collect()
            dispatcher.join(0.1)
        collect()
        if board.error is not None:
            raise board.error
    except BaseException:
        board.close()
        with contextlib.suppress(Exception):  # the first failure is the one to report
            collect()  # what the workers finished is kept before the job ends
        raise
    report.ran.sort(key=lambda tr: (tr[0].study, tr[0].number))
    if board.lost:
        raise RankLost("; ".join(board.lost.values()) + f"; the trials not recorded run "
                       f"again when the same command runs again ({len(report.ran)} recorded "
                       f"now)")
    for o in opened:
        o.study.finish("succeeded")
    return report


def _release(comm: Any, silence: float) -> None:
    """Answer every worker's first request with `stop` (rank 0 could not set the tuning up)."""
    board = _Board([])
    dispatcher = _Dispatcher(comm, board, [], "", silence)
    dispatcher.run()


# ------------------------------------------------------------------ ranks 1..K-1
def _work(comm: Any, workload: Any, submission: Any, backend: str, data_dir: str | None,
          silence: float) -> None:
    """Ask rank 0 for trials and train each through a Relay until told to stop."""
    from d500.ledger.relay import Relay
    from d500.training.tuning import Trial, run_trial

    relay = Relay()
    rank, size = comm.Get_rank(), comm.Get_size()
    record = None
    while True:
        job = _ask(comm, record, silence)
        if job is None:
            return
        trial = Trial(**job["trial"])
        with _Heartbeat(comm, silence / 6):
            run_trial(workload, submission, backend, trial, job["study_id"], ledger=relay,
                      data_dir=data_dir,
                      run_kwargs={"group": job["group"], "rank": rank, "world_size": size})
        record = relay.take()


def _ask(comm: Any, record: dict[str, Any] | None, silence: float) -> dict[str, Any] | None:
    """Send READY (with the last record) and wait for rank 0's answer, sleeping between polls."""
    _wait([comm.isend({"record": record}, dest=0, tag=READY)], silence,
          "rank 0 to take the last trial's record")
    deadline = time.monotonic() + silence
    while not comm.iprobe(source=0, tag=ASSIGN):
        if time.monotonic() > deadline:
            raise RankLost(f"rank 0 did not answer for {silence:g} s")
        time.sleep(POLL)
    return comm.recv(source=0, tag=ASSIGN)


def _wait(requests: list[Any], silence: float, what: str) -> None:
    deadline = time.monotonic() + silence
    while not all(r.Test() for r in requests):
        if time.monotonic() > deadline:
            raise RankLost(f"waited {silence:g} s for {what}")
        time.sleep(POLL)


class _Heartbeat:
    """While a worker trains: a BEAT to rank 0 every `every` seconds, from a thread, so that
    rank 0 tells a long trial from a dead rank."""

    def __init__(self, comm: Any, every: float):
        self.comm, self.every = comm, max(every, 0.05)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="d500-tune-heartbeat",
                                        daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        sends: list[Any] = []
        while not self._stop.wait(self.every):
            sends = [s for s in sends if not s.Test()]
            sends.append(self.comm.isend(None, dest=0, tag=BEAT))
        while sends:  # small messages: sent at once, finished before READY follows them
            sends = [s for s in sends if not s.Test()]
            time.sleep(POLL)
