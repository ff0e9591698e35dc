"""The body of one level-3 run on one rank: the ranks train as one trainee of the judge
(d500.distributed.judge, which holds the clock, the held-out data, the evaluations and the stop
rule). Rank 0 relays the judge's commands to every rank: the training split, each chunk of steps
(every rank its share of every global batch, through the scheme), the end; it hands the scheme's
model over inside `scheme.evaluated()` where an evaluation follows, and every rank's figures at
the end (d500.distributed.trainer opens, guards and ends the run); every rank's state for a
checkpoint, and back (d500.distributed.resuming)."""

from __future__ import annotations

import math
import os
import pickle
import socket
import time
from typing import Any

import numpy as np

from d500.distributed import figures as figs
from d500.training.trainer import Layout
from d500.training.worker import TICK

PRECISION_COMM = "lowest_numerical_precision_in_comm"  # MLPerf Training 6.1's key
DATA_PARALLELISM = "data_parallelism"  # d500's, after MLPerf's *_parallelism keys
POLL = 0.0002  # seconds between tests of a rank waiting for rank 0


def lazy_barrier(mpi: Any) -> None:
    """A barrier on the mpi4py communicator `mpi` (None: one rank) in which waiting ranks sleep
    between tests (MPICH's blocking calls spin a core, which an oversubscribed machine's busy
    rank needs)."""
    if mpi is None:
        return
    _wait(mpi.Ibarrier())


def lazy_bcast(mpi: Any, value: Any) -> Any:
    """Rank 0's `value` on every rank (None: one rank), waiting ranks sleeping between tests."""
    if mpi is None:
        return value
    data = pickle.dumps(value) if mpi.Get_rank() == 0 else b""
    size = np.array([len(data)], dtype=np.int64)
    _wait(mpi.Ibcast(size, root=0))
    buffer = np.frombuffer(data, dtype=np.uint8).copy() if data else np.empty(size[0], np.uint8)
    _wait(mpi.Ibcast(buffer, root=0))
    return value if mpi.Get_rank() == 0 else pickle.loads(buffer.tobytes())


def _wait(request: Any) -> None:
    while not request.Test():
        time.sleep(POLL)


def bcast_arrays(mpi: Any, arrays: list[np.ndarray] | None) -> list[np.ndarray]:
    """Rank 0's arrays on every rank: their shapes and types, then their buffers."""
    if mpi is None:
        return list(arrays)
    meta = lazy_bcast(mpi, None if arrays is None else [(a.shape, a.dtype.str) for a in arrays])
    out = []
    for i, (shape, dtype) in enumerate(meta):
        a = np.ascontiguousarray(arrays[i]) if arrays is not None else np.empty(shape, dtype)
        _wait(mpi.Ibcast(a, root=0))
        out.append(a)
    return out


def layout(order: Any) -> Layout:
    """How the ranks split each global batch, and its MLLOG keys (the judge logs them)."""
    from d500.distributed.judge import data_ranks
    data = data_ranks(order)

    def keys(log: Any) -> None:
        log.event(PRECISION_COMM, order.spec.comm_precision)
        log.event(DATA_PARALLELISM, data)
    return Layout(order.global_batch, math.ceil(order.global_batch / data), keys)


class RankLoop:
    """One run on one rank: `run()` relays the judge's commands until its result, which it
    returns (status, error, figures: rank 0's; the others get status and error). `ticks`: rank
    0 sends its judge ("tick", step, loss) every TICK s, for the judge's progress display."""

    def __init__(self, job: Any, seed: int, trainer: Any, scheme: Any, reducer: Any,
                 judge: Any, ticks: bool, control: Any, mark: Any):
        self.job, self.seed, self.trainer, self.scheme = job, seed, trainer, scheme
        self.reducer, self.judge = reducer, judge
        self.ticks = bool(ticks) and judge is not None
        self.ticked = 0.0  # when the last tick was sent
        self.control = control  # an mpi4py communicator of its own (None: one rank)
        self.mark = mark  # contention.Mark of the run's start on this rank
        self.comm, self.wl = job.comm, job.workload
        # every communicator traffic is counted on: the world's, and the scheme's own where they
        # are split from it (a pipeline's data and pipeline dimensions at 4 ranks)
        own = getattr(scheme, "counted", list)()
        self.comms = list({id(c): c for c in [self.comm, *own]}.values())
        self.stats = figs.RankStats(self.comm.rank, socket.gethostname(), os.getpid())
        own = getattr(scheme, "traffic", None)  # ddp: counted by its hook, no seconds
        self.own_traffic = own if own is not None and not callable(own) else None
        if self.own_traffic is not None:
            self.stats.comm_seconds = None
        self.durations: list[tuple[float, float]] = []  # per step: wall, in collectives
        self.step = 0
        self.shown_loss = math.nan  # the last global loss rank 0 knows (a pipeline's stage 0)

    # ------------------------------------------------------------------ the relay
    def run(self) -> tuple[str, str, dict[str, float]]:
        comm, judge = self.comm, self.judge
        self.scheme.start()  # every rank from rank 0's parameters (init, before the clock)
        for c in self.comms:
            c.reset()
        lazy_barrier(self.control)
        data = None
        if judge is not None:  # run_start: the judge's clock runs from here
            judge.send(("ready",))
            _, x, y, total = judge.expect("data")
            data = [x, y, np.array([total])]
        x, y, total = bcast_arrays(self.control, data)
        self.take(x, y, int(total[0]))
        while True:
            got = self._next() if judge is not None else None
            # a checkpoint's states go to their ranks by scatter, not with the command
            command = lazy_bcast(self.control, got[:1] if got and got[0] == "restore" else got)
            if command[0] == "train":
                self._chunk(*command[1:])
            elif command[0] in ("save", "restore"):
                self._checkpoint(command[0], got)
            elif command[0] == "refused":  # the judge's check of a resume, on every rank
                from d500.distributed.resuming import Refused
                raise Refused(command[1])
            elif command[0] == "finish":
                self.scheme.finish()  # the scheme's final model on every rank
                state = self._handed(command[1])
                if judge is not None:
                    judge.send(("state", state))
            elif command[0] == "stats":
                ranks = self._gather()
                if judge is not None:
                    judge.send(("stats", ranks))
            elif command[0] == "result":
                _, status, error, figures = command
                return status, error or "", figures if comm.rank == 0 else {}

    def take(self, x: np.ndarray, y: np.ndarray, total: int) -> None:
        """The training split and the run's step count (from the judge): this rank's shares of
        every global batch, the learning rate at each step."""
        from d500.training.data.samplers import PartitionedSampler
        self.total = total
        self.lr_at = self.job.entry.recipe.schedule(self.total)
        data = self.scheme.comm  # the data dimension: its ranks share each global batch
        self.sampler = PartitionedSampler(len(y), self.job.global_batch, self.seed, data.rank,
                                          data.size, self.wl.drop_last)
        self.x, self.y = x, y

    def _checkpoint(self, what: str, got: tuple[Any, ...] | None) -> None:
        """A checkpoint (d500.distributed.resuming): every rank's state to the judge ("save"),
        or the judge's checkpoint back into every rank ("restore")."""
        from d500.distributed import resuming
        self.scheme.settle()
        if what == "save":
            every = self._seen()
            if self.judge is not None:
                self.judge.send(("saved", every))
            return
        own = resuming.scatter(self.control, got[1] if got is not None else None)
        self.step = resuming.restore(self.scheme, own)
        lazy_barrier(self.control)
        # pieces: the judge checks what they restored against what it saw (resuming.verify)
        seen = self._seen() if resuming.pieced(self.scheme) else None
        if self.judge is not None:
            self.judge.send(("restored", seen))

    def _seen(self) -> dict[str, Any] | None:
        """Every rank's state on rank 0 (collective) and, where ranks hold pieces, the whole
        model gathered as for an evaluation, for the judge's check."""
        from d500.distributed import resuming
        every = resuming.gather(self.control, resuming.capture(self.scheme, self.step))
        if resuming.pieced(self.scheme):
            whole = self._handed(True)
            every = every if every is None else {**every, "whole": whole}
        return every

    def _next(self) -> tuple[Any, ...]:
        """The judge's next command (rank 0); a stop that crossed the end of its chunk is
        dropped."""
        while True:
            command = self.judge.receive()
            if command[0] != "stop":
                return command

    def _chunk(self, epoch: int, first: int, count: int, want: bool, _none: Any,
               batch: int | None = None) -> None:
        """Steps first..first+count-1 of `epoch` on every rank at the global batch (the judge's
        `batch`: level 3 grows none, d500.training.trainer.ready); rank 0 reports each step's loss
        over the global batch (the ranks' losses weighted by their shares; non-finite where any
        rank's was, naming the first such rank) and, if `want`, the model. (`_none`: where the
        last validation accuracy once came, for rank 0's progress display: never sent now.)"""
        if batch is not None and batch != self.job.global_batch:
            from d500.errors import D500Error
            raise D500Error(f"the judge asked for a global batch of {batch}; this run's is "
                            f"{self.job.global_batch}")
        order = list(self.sampler.shares(epoch))[first:first + count]
        mine = np.empty((2, len(order)), dtype=np.float64)  # loss, share size per step
        since = len(self.durations)
        for i, (index, weight) in enumerate(order):
            mine[0, i] = self._step({"input": self.x[index], "labels": self.y[index]},
                                    self.lr_at(self.step), weight)
            mine[1, i] = len(index) if self.scheme.holds_loss else 0  # its weight
        self._settle(since)  # a server's replies still owed, before the collective below
        every = self._gathered(mine)
        state = self._handed(want)
        if self.judge is None:
            return
        losses, where = _global_losses(every)
        self.shown_loss = losses[-1] if losses else self.shown_loss
        self.judge.send(("trained", losses, state, self.judge.pending_stop(), where))

    def _gathered(self, mine: np.ndarray) -> np.ndarray | None:
        """Every rank's (loss, share) rows on rank 0, shape (ranks, 2, steps); None elsewhere."""
        if self.control is None:
            return mine[None]
        every = np.empty((self.comm.size, *mine.shape)) if self.comm.rank == 0 else None
        self.control.Gather(mine, every, root=0)
        return every

    def _handed(self, want: bool) -> dict[str, np.ndarray] | None:
        """The scheme's model (collective: every rank) as rank 0 hands it to the judge."""
        if not want:
            return None
        state = None
        with self.scheme.evaluated():  # a decentralised scheme's average, for instance
            if self.comm.rank == 0:
                state = self.scheme.handed()
            lazy_barrier(self.control)
        return state

    def _settle(self, since: int) -> None:
        """scheme.settle(): the training traffic the steps left in flight completed (a
        parameter server's drain of the workers' gradients), its seconds the steps' own: in
        equal shares to those from `since` (an index of `durations`), its collectives' seconds
        to their communication. A step's figure is what a step costs: a scheme leaving its work
        to settle() gets no faster step for it (tests/distributed/test_settle_timed.py)."""
        c = sum(x.seconds for x in self.comms)
        t = time.perf_counter()
        self.scheme.settle()
        dt = time.perf_counter() - t
        comm = min(dt, max(0.0, sum(x.seconds for x in self.comms) - c))
        self.stats.step_seconds += dt
        steps = len(self.durations) - since
        for i in range(since, len(self.durations)):
            wall, inside = self.durations[i]
            self.durations[i] = (wall + dt / steps, inside + comm / steps)

    def _step(self, feeds: dict[str, np.ndarray], lr: float, weight: float = 1.0) -> float:
        st = self.stats
        c = sum(x.seconds for x in self.comms)
        t = time.perf_counter()
        loss = self.scheme.step(feeds, lr, weight)
        dt = time.perf_counter() - t
        st.step_seconds += dt
        # the collectives' seconds inside this step, at most the step (a thread's collectives
        # beside the step's own cannot add more): compute = step - comm >= 0 by construction
        self.durations.append((dt, min(dt, max(0.0, sum(x.seconds for x in self.comms) - c))))
        st.steps += 1
        self.step += 1
        if math.isfinite(loss) and self.scheme.holds_loss:
            st.loss_sum += loss
            st.loss_count += 1
        if self.ticks and time.perf_counter() - self.ticked >= TICK:
            self.judge.send(("tick", self.step, loss if self.scheme.holds_loss
                             else self.shown_loss))
            self.ticked = time.perf_counter()
        return loss

    # ------------------------------------------------------------------ the end
    def _gather(self) -> list[figs.RankStats]:
        """This rank's figures to rank 0 (training traffic: every collective name but the
        scheme's `evaluate` and `finish`)."""
        from d500.distributed.schemes.base import EVALUATE, FINISH
        st, comm = self.stats, self.comm
        if self.own_traffic is not None:
            t = self.own_traffic
            st.sent, st.received = t.sent, t.received
            st.traffic = {self.scheme.traffic_name: {"calls": t.calls, "sent": t.sent,
                                                     "received": t.received}}
        else:
            counted = _merged([c.counters() for c in self.comms])
            st.traffic = {n: t for n, t in counted.items() if n not in (EVALUATE, FINISH)}
            st.eval_traffic = {n: t for n, t in counted.items() if n in (EVALUATE, FINISH)}
            st.sent = int(sum(t["sent"] for t in st.traffic.values()))
            st.received = int(sum(t["received"] for t in st.traffic.values()))
            # inside the steps and the settle() after each chunk (`_settle`: a server's drain
            # of the workers' gradients), which counts in the steps' time too
            st.comm_seconds = float(sum(comm for _, comm in self.durations))
        st.cpu_seconds = self.mark.own_cpu()
        if self.durations:
            steps = np.array(self.durations)
            st.step_median = float(np.median(steps[:, 0]))
            st.compute_median = float(np.median(steps[:, 0] - steps[:, 1]))
        if self.reducer is not None:
            st.payload_bytes, st.dense_bytes = self.reducer.sent_bytes, self.reducer.dense_bytes
        memory = getattr(self.scheme, "memory", dict)()  # bytes held: params, grads, state
        st.scheme = {k: float(v) for k, v in {**memory, **self.scheme.figures()}.items()}
        st.scheme_details = dict(getattr(self.scheme, "details", dict)())
        if self.control is None:
            return [st]
        every = self.control.gather(st, root=0)
        return every if comm.rank == 0 else []


def _merged(counters: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Communicators' counts summed per collective name."""
    out: dict[str, dict[str, float]] = {}
    for one in counters:
        for name, t in one.items():
            into = out.setdefault(name, dict.fromkeys(t, 0))
            for k, v in t.items():
                into[k] += v
    return out


def _global_losses(every: np.ndarray) -> tuple[list[float], str]:
    """Each step's loss over the global batch from every rank's (loss, share) rows, cut after
    the first step with a non-finite loss on some rank, and " on rank R" naming that rank."""
    loss, share = every[:, 0, :], every[:, 1, :]
    bad = ~np.isfinite(loss)
    with np.errstate(invalid="ignore", over="ignore"):
        mean = (np.where(bad, 0.0, loss) * share).sum(axis=0) / share.sum(axis=0)
    if not bad.any():
        return [float(v) for v in mean], ""
    step = int(np.argmax(bad.any(axis=0)))
    rank = int(np.argmax(bad[:, step]))
    return [float(v) for v in mean[:step]] + [float(loss[rank, step])], f" on rank {rank}"
