"""The body of one level-3 run on one rank: the clock, its share of every global batch through the
scheme, the evaluations (rank 0) and the stop decisions every rank takes together, and at the end
this rank's figures gathered to rank 0 (d500.distributed.trainer opens and records the run)."""

from __future__ import annotations

import math
import os
import socket
import time
from typing import Any

import numpy as np

from d500 import mllog
from d500.distributed import figures as figs
from d500.training.trainer import (
    Clock,
    Progress,
    accuracy,
    log_run_keys,
    missed_figures,
    recorded,
    run_figures,
)

PRECISION_COMM = "lowest_numerical_precision_in_comm"  # MLPerf Training 6.1's key
DATA_PARALLELISM = "data_parallelism"  # d500's, after MLPerf's *_parallelism keys
POLL = 0.0002  # seconds between tests of a rank waiting for rank 0


def lazy_barrier(mpi: Any) -> None:
    """A barrier on the mpi4py communicator `mpi` (None: one rank) in which waiting ranks sleep
    between tests (MPICH's blocking calls spin a core, which an oversubscribed machine's busy
    rank needs)."""
    if mpi is None:
        return
    request = mpi.Ibarrier()
    while not request.Test():
        time.sleep(POLL)


class RankLoop:
    """One run on one rank (the state the loop and the evaluations share); `run()` returns
    (status, error, figures, every rank's stats): the last three on rank 0 only."""

    def __init__(self, job: Any, seed: int, trainer: Any, scheme: Any, reducer: Any, run: Any,
                 progress: Progress | None, control: Any, mark: Any):
        self.job, self.seed, self.trainer, self.scheme = job, seed, trainer, scheme
        self.reducer, self.run_, self.progress = reducer, run, progress
        self.control = control  # an mpi4py communicator of its own (None: one rank)
        self.mark = mark  # contention.Mark of the run's start on this rank
        self.comm, self.wl = job.comm, job.workload
        self.stats = figs.RankStats(self.comm.rank, socket.gethostname(), os.getpid())
        own = getattr(scheme, "traffic", None)  # ddp: counted by its hook, no seconds
        self.own_traffic = own if own is not None and not callable(own) else None
        if self.own_traffic is not None:
            self.stats.comm_seconds = None
        self.durations: list[tuple[float, float]] = []  # per step: wall, in collectives
        self.state: dict[str, Any] = {"step": 0, "losses": [], "val": None, "test": None,
                                      "reached": None, "test_at_target": None,
                                      "evaluated": None, "bad": None, "train_loss": math.nan}

    # ------------------------------------------------------------------ the loop
    def run(self) -> tuple[str, str, dict[str, float], list[figs.RankStats]]:
        from d500.training.data import dataset as datasets
        from d500.training.data.samplers import PartitionedSampler
        from d500.training.data.splits import split

        comm, wl, job = self.comm, self.wl, self.job
        recipe = job.entry.recipe
        self.scheme.start()  # every rank from rank 0's parameters (init, before the clock)
        comm.reset()
        lazy_barrier(self.control)
        # run_start (rank 0 records it): the clock runs from here, on every rank
        start = self.run_.begin() if self.run_ is not None else time.perf_counter()
        clock = self.clock = Clock(start=start)
        t0 = time.perf_counter()
        parts = split(datasets.load(wl.dataset["name"], job.data_dir), wl.split_spec())
        self.parts = parts
        x, y = parts.train.x, parts.train.y
        sampler = PartitionedSampler(len(y), job.global_batch, self.seed, comm.rank, comm.size,
                                     wl.drop_last)
        clock.data += time.perf_counter() - t0
        self.steps_per_epoch = len(sampler)
        total = wl.max_epochs * self.steps_per_epoch
        lr_at = recipe.schedule(total)
        if self.run_ is not None:
            self._log_keys(len(y), len(parts.validation.y))
        status = "missed"
        for epoch in range(wl.max_epochs):
            self._log(mllog.EPOCH_START, epoch + 1)
            stop = False
            t = time.perf_counter()
            for index in sampler.epoch(epoch):
                feeds = {"input": x[index], "labels": y[index]}
                t1 = time.perf_counter()
                clock.data += t1 - t
                self._step(feeds, lr_at(self.state["step"]), epoch, total)
                clock.train += time.perf_counter() - t1
                if wl.every_steps and self.state["step"] % wl.every_steps == 0:
                    stop = self._evaluate(self.state["step"] / self.steps_per_epoch)
                    if stop:
                        break
                t = time.perf_counter()
            self._log(mllog.EPOCH_STOP, epoch + 1, end=True)
            if not stop and wl.every_epochs and (epoch + 1) % wl.every_epochs == 0:
                stop = self._evaluate(float(epoch + 1))
            elif not stop:
                stop = self._decide()
            if stop:
                break
        self.scheme.finish()  # the scheme's final model on every rank (async_ps drains)
        if self.state["bad"] is not None:
            status = "diverged"
        else:
            if self.state["reached"] is None and self.state["evaluated"] != self.state["step"]:
                self._evaluate(self.state["step"] / self.steps_per_epoch)  # the last one
            reached = self.state["reached"]
            if reached is not None and reached[0] <= wl.max_seconds:
                status = "succeeded"
        ranks = self._gather()
        if self.run_ is None:
            return status, "", {}, ranks
        return status, self._why(status), self._figures(status, ranks), ranks

    def _step(self, feeds: dict[str, np.ndarray], lr: float, epoch: int, total: int) -> None:
        st, comm = self.stats, self.comm
        c = comm.seconds
        t = time.perf_counter()
        loss = self.scheme.step(feeds, lr)
        dt = time.perf_counter() - t
        st.step_seconds += dt
        self.durations.append((dt, comm.seconds - c))
        st.steps += 1
        self.state["step"] += 1
        if math.isfinite(loss):
            self.state["losses"].append(loss)
            st.loss_sum += loss
            st.loss_count += 1
        elif self.state["bad"] is None:
            self.state["bad"] = (self.state["step"], loss)
        if self.progress is not None:
            self.progress({"step": self.state["step"], "total": total, "loss": loss,
                           "val_accuracy": self.state["val"], "epoch": epoch + 1})

    # ------------------------------------------------------------------ evaluation, decisions
    def _evaluate(self, epoch: float) -> bool:
        """Validation on rank 0 (on the clock) and test (off it) inside scheme.evaluated()
        (whose traffic the scheme counts apart), then the stop decision; True when every rank
        stops here."""
        state = self.state
        meta = {mllog.EPOCH_NUM: epoch,
                mllog.SAMPLES_COUNT: state["step"] * self.job.global_batch}
        with self.scheme.evaluated():
            if self.run_ is not None:
                self._validate(epoch, meta)
            lazy_barrier(self.control)
        state["evaluated"] = state["step"]
        return self._decide()

    def _validate(self, epoch: float, meta: dict[str, Any]) -> None:
        state, clock, parts, log = self.state, self.clock, self.parts, self.run_.mllog
        log.start(mllog.EVAL_START, metadata=meta)
        t = time.perf_counter()
        val = accuracy(self.trainer.predict, parts.validation.x, parts.validation.y)
        clock.evaluation += time.perf_counter() - t
        log.event(mllog.EVAL_ACCURACY, val, metadata=meta)
        at, stamp = clock.now(), time.time() * 1e3  # eval_stop at the clock's reading
        log.end(mllog.EVAL_STOP, metadata=meta, time_ms=stamp)
        t = time.perf_counter()
        test = accuracy(self.trainer.predict, parts.test.x, parts.test.y)
        clock.paused += time.perf_counter() - t
        losses = state["losses"]
        train_loss = float(np.mean(losses)) if losses else math.nan
        state["losses"] = []
        state.update(val=val, test=test, train_loss=train_loss)
        if val >= self.wl.target and state["reached"] is None:
            state["reached"] = (at, epoch, state["step"])
            state["test_at_target"] = test
        metrics = {"val_accuracy": val, "test_accuracy": test}
        if math.isfinite(train_loss):
            metrics["train_loss"] = train_loss
        self.run_.evaluation(step=state["step"], epoch=epoch, metrics=metrics, wall_time=at)

    def _decide(self) -> bool:
        """Every rank's divergence state to rank 0, rank 0's decision to every rank: stop when
        a rank's loss went non-finite, the target was met, or the budget is spent."""
        state, comm = self.state, self.comm
        bad = state["bad"]
        flags = np.array([bad[0] if bad else -1, bad[1] if bad else 0.0, comm.rank],
                         dtype=np.float64)
        if self.control is not None:
            every = np.empty((comm.size, 3), dtype=np.float64)
            self.control.Gather(flags, every, root=0)
        else:
            every = flags[None, :]
        decision = np.zeros(4, dtype=np.float64)  # stop, bad step, bad loss, bad rank
        if comm.rank == 0:
            failing = every[every[:, 0] >= 0]
            if failing.size:
                first = failing[np.argmin(failing[:, 0])]
                decision[:] = (1.0, first[0], first[1], first[2])
            elif state["reached"] is not None or self.clock.now() > self.wl.max_seconds:
                decision[0] = 1.0
        if self.control is not None:
            request = self.control.Ibcast(decision, root=0)
            while not request.Test():
                time.sleep(POLL)
        if decision[1] > 0 and state["bad"] is None:
            state["bad"] = (int(decision[1]), float(decision[2]))
        if decision[1] > 0:
            state["bad_rank"] = int(decision[3])
        return bool(decision[0])

    # ------------------------------------------------------------------ the end
    def _gather(self) -> list[figs.RankStats]:
        """This rank's figures to rank 0 (training traffic: every collective name but the
        scheme's `evaluate` and `finish`)."""
        from d500.distributed.schemes.base import EVALUATE, FINISH
        st, comm = self.stats, self.comm
        if self.own_traffic is not None:
            t = self.own_traffic
            st.sent, st.received = t.sent, t.received
            st.traffic = {"ddp_allreduce": {"calls": t.calls, "sent": t.sent,
                                            "received": t.received}}
        else:
            counted = comm.counters()
            st.traffic = {n: t for n, t in counted.items() if n not in (EVALUATE, FINISH)}
            st.eval_traffic = {n: t for n, t in counted.items() if n in (EVALUATE, FINISH)}
            st.sent = int(sum(t["sent"] for t in st.traffic.values()))
            st.received = int(sum(t["received"] for t in st.traffic.values()))
            st.comm_seconds = float(sum(t["seconds"] for t in st.traffic.values()))
        st.cpu_seconds = self.mark.own_cpu()
        if self.durations:
            steps = np.array(self.durations)
            st.step_median = float(np.median(steps[:, 0]))
            st.compute_median = float(np.median(steps[:, 0] - steps[:, 1]))
        if self.reducer is not None:
            st.payload_bytes, st.dense_bytes = self.reducer.sent_bytes, self.reducer.dense_bytes
        st.scheme = {k: float(v) for k, v in self.scheme.figures().items()}
        st.scheme_details = dict(getattr(self.scheme, "details", dict)())
        if self.control is None:
            return [st]
        every = self.control.gather(st, root=0)
        return every if comm.rank == 0 else []

    def _figures(self, status: str, ranks: list[figs.RankStats]) -> dict[str, float]:
        wl, state, clock = self.wl, self.state, self.clock
        out = (missed_figures(wl) if status == "diverged"
               else run_figures(wl, state, clock, self.job.global_batch))
        losses = [r.loss_sum / r.loss_count for r in ranks if r.loss_count]
        if losses:
            out["train_loss"] = float(np.mean(losses))
        out.update(figs.aggregate(ranks))
        return recorded(out)

    def _why(self, status: str) -> str:
        state, wl = self.state, self.wl
        if status == "diverged":
            step, loss = state["bad"]
            return (f"the training loss is {loss} at step {step} on rank "
                    f"{state.get('bad_rank', 0)}")
        if status != "missed":
            return ""
        val = state["val"] if state["val"] is not None else math.nan
        return (f"validation accuracy {val:.4f} after {state['step']} steps did not reach the "
                f"target {wl.target} within the budget ({wl.max_epochs} epochs, "
                f"{wl.max_seconds:g} s)")

    # ------------------------------------------------------------------ MLLOG
    def _log(self, key: str, epoch: int, end: bool = False) -> None:
        if self.run_ is None:
            return
        log = self.run_.mllog
        (log.end if end else log.start)(key, metadata={mllog.EPOCH_NUM: epoch})

    def _log_keys(self, train_samples: int, eval_samples: int) -> None:
        job, log = self.job, self.run_.mllog
        shape = tuple(self.parts.train.x.shape[1:])
        log_run_keys(log, self.wl, job.entry.recipe, train_samples, eval_samples, shape,
                     micro_batch=math.ceil(job.global_batch / self.comm.size))
        log.event(PRECISION_COMM, job.spec.comm_precision)
        log.event(DATA_PARALLELISM, self.comm.size)
