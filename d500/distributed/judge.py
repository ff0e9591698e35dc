"""Level 3's judge: a process of its own, spawned by rank 0 before any of the entry's code is
imported anywhere, that holds what level 2's supervisor holds (d500.training.trainer): the
clock, the validation and test splits, its own copy of the model to evaluate, the stop rule,
the ledger run and the MLLOG. The MPI ranks hold the entry's code, the scheme and the training
split, which the judge sends to rank 0 after run_start and rank 0 broadcasts. Where the kernel
permits (root), rank 0's helper starts it (d500.distributed.cover), outside the cover that hides
$D500_HOME from every rank's entry code: the judge alone reads and writes the ledger there.

    judge = Judge.spawn(job, seed)      # rank 0, before build(): nothing of the entry's yet
    run_id = judge.open()               # after every rank built: the ledger run opens
    ...                                 # d500.distributed.loop.RankLoop relays the protocol
    judge.lost("rank 1 died")           # any failure: the judge records the run failed

Rank 0 speaks d500.training.worker's protocol to it, for all the ranks: the judge's loop is
level 2's `_supervise`, so the two levels keep one clock, one evaluation and one stop rule. Rank
0 relays each command to every rank (a chunk of steps, the end), hands over the scheme's model
inside `scheme.evaluated()` where an evaluation follows, and at the end the ranks' figures
(figures.RankStats, as they report them: step and communication times are the ranks' own;
every scored time is the judge's). Failures reach the judge on a second pipe (`lost`), which
it reads whenever it waits, and it records the run failed before it answers. A pipeline's ranks
(or tensor shards) hand over the model their stages gathered, and the judge audits their work
(d500.distributed.pipeline.audit: the first step after each hand-over recomputed).
"""

from __future__ import annotations

import contextlib
import functools
import math
import multiprocessing
import os
import socket
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

from d500 import children, untrusted
from d500.distributed.jobtree import Escaped, JobTree
from d500.distributed.resuming import Refused, verify
from d500.errors import D500Error, Diverged, describe
from d500.training import cpu
from d500.training.worker import START, Trainee, WorkerError

LOST_ACK = 30.0  # seconds a failing rank 0 waits for the judge to record the run


@dataclass
class Order:
    """What the judge needs of one level-3 run (sent before the entry's code runs anywhere)."""

    workload: Any  # d500.distributed.workloads.DistributedWorkload
    entry: Any  # d500.training.submission.Submission (its optimizer file is never imported)
    spec: Any  # d500.distributed.spec.Spec
    backend: str
    seed: int
    world_size: int
    global_batch: int
    ledger_path: str
    stamp: dict[str, Any] | None  # details every new run carries (a reproduction's)
    data_dir: str | None
    group: str
    threads: dict[str, Any] | None  # rank 0's d500.threads.recorded(): recorded, and used here
    checkpoint_every: int | None = None  # epochs between checkpoints (d500.training.resume)
    resumed: Any = None  # d500.training.resume.Resumed: the checkpoint this run continues
    progress: bool = False  # show a progress bar on stderr (rank 0's ticks, the validation)


class Judge:
    """Rank 0's handle on the judge process."""

    def __init__(self, order: Order):
        from d500.distributed import cover
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self._lost, lost_child = ctx.Pipe()
        self._lock = threading.Lock()
        helper = cover.helper()  # the rank's helper, outside the cover it puts on $D500_HOME
        if helper is not None:
            self.process: Any = helper.spawn(child, lost_child)
        else:
            self.process = ctx.Process(target=main, args=(child, lost_child), name="d500-judge",
                                       daemon=True)
            self.process.start()
        child.close()
        lost_child.close()
        self.conn.send(order)

    @classmethod
    def spawn(cls, job: Any, seed: int) -> Judge:
        from d500 import threads
        ledger = job.ledger
        return cls(Order(job.workload, job.entry, job.spec, job.backend, seed, job.comm.size,
                         job.global_batch, str(ledger.path), getattr(ledger, "stamp", None),
                         job.data_dir, job.group, threads.recorded(), job.checkpoint_every,
                         job.resumed, job.progress))

    def shielded(self) -> None:
        """Wait until the judge process has made itself undumpable: a /proc/PID/mem opened
        before then (a confined rank may: the judge, its child, holds no capability either)
        stays readable after."""
        self.expect("shielded")

    def open(self) -> int:
        """Open the ledger run (once every rank built); its id, or the judge's error raised."""
        self.send(("open",))
        return int(self.expect("opened")[1])

    def send(self, message: tuple[Any, ...]) -> None:
        """Send the judge a message; a judge that has ended is raised as its last word (e.g. a
        hand-over it refused before this was sent), read from the pipe it left behind."""
        try:
            self.conn.send(message)
        except OSError:
            self.receive()
            raise D500Error("the judge process ended while rank 0 wrote to it") from None

    def receive(self) -> tuple[Any, ...]:
        """The judge's next command; its error as a D500Error."""
        try:
            message = self.conn.recv()
        except (EOFError, OSError):
            self.process.join(timeout=5)
            code = self.process.exitcode  # (None: its helper's child, d500.distributed.cover)
            said = "" if code is None else f" (exit code {code})"
            raise D500Error(f"the judge process ended{said} without a word") from None
        if message[0] == "error":
            raise D500Error(str(message[1]))
        return message

    def expect(self, what: str) -> tuple[Any, ...]:
        message = self.receive()
        if message[0] != what:
            raise D500Error(f"the judge sent '{message[0]}' where '{what}' was due")
        return message

    def pending_stop(self) -> bool:
        """Whether the judge said stop (the time budget ran out) while the ranks trained."""
        stopped = False
        while self.conn.poll(0):
            message = self.receive()
            if message[0] != "stop":
                raise D500Error(f"the judge sent '{message[0]}' during training")
            stopped = True
        return stopped

    def lost(self, why: str, gone: bool = False, interrupted: bool = False) -> None:
        """Tell the judge the run failed (any thread; once); wait until it recorded that.
        `gone`: a rank's process died or went silent (the run can be resumed); `interrupted`:
        stopped by Ctrl-C, recorded `interrupted` as level 2 records it (and resumable)."""
        with self._lock:
            try:
                self._lost.send(("lost", why, gone, interrupted))
                if self._lost.poll(LOST_ACK):
                    self._lost.recv()
            except (EOFError, OSError, ValueError):
                pass  # the judge is gone (it ended, or recorded the run already)

    def close(self) -> None:
        children.end(self.conn, self.process, wait=30)
        self._lost.close()


class Ranks(Trainee):
    """The judge's side: the ranks, behind rank 0, as one trainee. A stop message cannot end a
    chunk early (every rank would have to agree on the step): the ranks stop at its end."""

    grace = None

    def __init__(self, conn: Any, lost: Any):
        super().__init__(conn)
        self.lost = lost
        self.audit: Any = None  # a pipeline's (d500.distributed.pipeline.audit.Audit)
        self.remaining: Any = None  # while a chunk trains: the budget left (it beats the heart)
        self.resumed: Any = None  # ranks holding pieces, resumed: the checkpoint to check against
        self.tree: Any = None  # jobtree.JobTree: this host's ranks, behind their keepers
        self.given: tuple[int, str] | None = None  # each rank's recorded threads, the backend

    whose = "the threads of the ranks on rank 0's host"
    # d500.training.cpu's bound x this: besides the entry's threads a rank runs d500's watchdog
    # thread and polls while rank 0 or the judge works, each runnable while it waits for a CPU.
    # Measured (benchmarks/rank_cpu.py, README "What a worker's threads use"): honest 2-rank
    # digits-mlp runs at --threads 1 read up to 1.35 on torch at load 16 (tensor-parallel),
    # 1.30 on tensorflow; a rank computing on one thread of its own beside the steps, 2.07-2.11
    leeway = 1.25

    def allotment(self) -> tuple[int, str] | None:
        """The threads this host's ranks were given in all (the ranks here x the count rank 0
        records, which each rank here configured alike: d500.distributed.launch.core_share or
        --threads) and the backend; None where not measured (no job tree, no count)."""
        if self.tree is None or self.given is None:  # (no tree off Linux: `_tree`)
            return None
        return len(self.tree.ranks) * self.given[0], self.given[1]

    def cpu_seconds(self) -> tuple[float, dict[int, tuple[float, ...]]] | None:
        """This host's ranks' CPU seconds and threads (jobtree.JobTree.cpu_seconds)."""
        return self.tree.cpu_seconds() if self.tree is not None else None

    def hold(self) -> list[int]:
        """Stop every rank's processes on this host (all ranks wait for the judge meanwhile:
        rank 0 on its pipe, the others in a collective it follows) while the judge measures test
        accuracy off the clock (d500.distributed.jobtree); none where the judge runs in a test's
        thread. A rank's keeper or waiter stopped or killed raises jobtree.Escaped."""
        return self.tree.hold() if self.tree is not None else []

    def give(self, x: Any, y: Any, total_steps: int) -> None:
        if self.audit is not None:
            self.audit.given(x, y)
        super().give(x, y, total_steps)

    def restore(self, state: dict[str, Any]) -> tuple[Any, ...]:
        """Where ranks hold pieces, what they hand over once restored must be what this judge saw
        at the checkpoint (d500.distributed.resuming.verify): else every rank is told, and the
        run ends refused."""
        restored = super().restore(state)
        if self.resumed is not None:
            try:
                verify(self.resumed, restored[1] if len(restored) > 1 else None)
            except Refused as err:
                self.conn.send(("refused", str(err)))
                raise
        return restored

    def train(self, epoch: int, first: int, count: int, *args: Any, **kwargs: Any) -> Any:
        self.remaining = args[0] if args else kwargs["remaining"]
        try:
            chunk = super().train(epoch, first, count, *args, **kwargs)
        finally:
            self.remaining = None
        if self.audit is not None:  # on the clock: the judge's own time in training
            self.audit.check(epoch, first, chunk.losses, chunk.state is not None)
        return chunk

    def _poll(self, timeout: float | None) -> bool:
        """Whether rank 0 spoke within `timeout` s. While a chunk trains (the ranks send no
        ticks) the budget is read every HEARTBEAT s, which writes the judge's heartbeat: a
        killed job's time after its last checkpoint is charged to its resumed run."""
        from d500.training.resume import HEARTBEAT
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if end is None else max(0.0, end - time.monotonic())
            ready = wait([self.conn, self.lost], left if self.remaining is None
                         else HEARTBEAT if left is None else min(left, HEARTBEAT))
            if self.lost in ready:
                stopped = False
                try:
                    _, why, gone, stopped = untrusted.receive(self.lost)
                except (EOFError, OSError):
                    why, gone = "rank 0 ended without a word", False
                except (untrusted.Forbidden, TypeError, ValueError) as err:
                    why, gone = f"rank 0 {err}", False
                raise Lost(str(why), bool(gone), stopped is True)
            if ready or (end is not None and time.monotonic() >= end):
                return bool(ready)
            if self.remaining is not None:
                self.remaining()  # the budget read: the heartbeat written

    def stats(self) -> list[Any]:
        """Every rank's figures.RankStats, gathered by rank 0."""
        self.conn.send(("stats",))
        return list(self._expect("stats", START)[1])

    def close(self) -> None:
        pass

    def _ended(self) -> str:
        return "rank 0 ended without a word"

    _who = "rank 0"

    def meter(self) -> RankMeter:
        """trainer._supervise's CPU meter: the ranks here pooled, and each alone."""
        return RankMeter(self)


class RankMeter(cpu.Meter):
    """d500.training.cpu.Meter over the ranks on rank 0's host pooled (details "worker_cpu"),
    and over each of them alone against the threads the run records (details "ranks_cpu", by
    rank): pooled, one rank on more threads than recorded hid behind its honest peers (2 ranks
    at --threads 1, rank 1 on 2: 1.5x pooled, under the 1.625x bound;
    tests/distributed/test_rank_threads_mpi.py)."""

    def __init__(self, ranks: Ranks):
        super().__init__(ranks)
        self.each = ([cpu.Meter(OneRank(ranks, one)) for one in ranks.tree.ranks]
                     if self.start is not None else [])

    def hold(self) -> list[int]:
        for one in self.each:
            one.hold()
        return super().hold()

    def release(self, held: list[int]) -> None:
        super().release(held)
        for one in self.each:
            one.release([])

    def check(self, run: Any) -> None:
        figures, over = {}, []
        for one in self.each:
            one.worked = self.worked
            said = _Said()
            try:
                one.check(said)
            except D500Error as err:
                over.append(err)
            if said.figures is not None:
                figures[one.worker.rank] = said.figures
        if figures:
            run.record(details={"ranks_cpu": figures})
        super().check(run)
        if over:
            raise over[0]


@dataclass
class OneRank:
    """One rank on rank 0's host as a cpu.Meter reads it: its CPU (its keeper and all behind
    it) against the threads the run records (every rank configured alike: rank 0's count);
    its hold is the pooled meter's."""

    ranks: Ranks
    one: Any  # jobtree.Local

    @property
    def rank(self) -> str:
        return self.one.rank

    @property
    def whose(self) -> str:
        return f"rank {self.one.rank}'s threads (on rank 0's host)"

    @property
    def leeway(self) -> float:
        return self.ranks.leeway

    def allotment(self) -> tuple[int, str] | None:
        return self.ranks.given

    def cpu_seconds(self) -> tuple[float, dict[int, tuple[float, ...]]]:
        return self.ranks.tree.rank_cpu_seconds(self.one)

    def hold(self) -> list[int]:
        return []

    def release(self, held: list[int]) -> None:
        pass


class _Said:
    """What a cpu.Meter records on a run (its figures), kept here."""

    figures: dict[str, Any] | None = None

    def record(self, details: dict[str, Any]) -> None:
        self.figures = details[cpu.DETAIL]


class Lost(WorkerError):
    """A rank (or rank 0 itself) failed; the run is recorded failed with this line. `gone`: a
    rank's process died or went silent (a restart from the last checkpoint may continue it)."""

    def __init__(self, why: str, gone: bool = False, interrupted: bool = False):
        super().__init__(why)
        self.gone, self.interrupted = gone, interrupted


def main(conn: Any, lost: Any) -> None:
    """The judge process: one level-3 run, from opening it to recording it. It dies with rank 0
    (a run whose rank 0 died shows `interrupted`, its writer gone), and ignores the signals
    meant for the ranks (^C, hydra's SIGUSR1 notice that a rank ended)."""
    import signal

    from d500.children import bound_to_parent
    if threading.current_thread() is threading.main_thread():  # (a test may run it in a thread)
        bound_to_parent()
        children.shield()  # the ranks run the entry's code, each confined (distributed.cli)
        children.confine()  # (started by a rank's helper, d500.distributed.cover, it held its
        #                     capabilities: d500's code needs none)
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    tree = _tree()  # (found before any rank runs the entry's code)
    from d500 import provenance
    provenance.facts()  # (the commands they run, git's, show $D500_HOME in their /proc/PID/root)
    conn.send(("shielded",))  # no rank runs the entry's code before this (trainer.judges)
    order: Order = conn.recv()  # sent as rank 0 spawned this process, before any entry code
    run, ranks = None, Ranks(conn, lost)
    ranks.tree = tree
    count = (order.threads or {}).get("count")
    ranks.given = (int(count), order.backend) if count else None  # (d500.training.cpu)
    try:
        message = untrusted.receive(conn)  # what follows rank 0 sends beside the entry's code
        if message[0] != "open":
            return  # rank 0 gave up before the run opened (a build failed on some rank)
        run = _open(order)
        conn.send(("opened", run.id))
        _judge(order, run, ranks)
    except Lost as err:
        _failed(order, run, str(err), err.gone, err.interrupted)
        _ack(lost)
    except Refused as err:  # every rank was told: the run is recorded failed, no figures
        _failed(order, run, str(err))
    except Escaped as err:  # recorded failed, then what left the job's tree ended; where a
        _failed(order, run, str(err), tree.lost_rank())  # rank died first: a rank lost
        try:
            conn.send(("error", str(err)))
        except (OSError, ValueError):
            pass
        tree.end_escaped()
    except (EOFError, OSError, KeyboardInterrupt):
        _failed(order, run, "rank 0 ended without a word")
    except Exception as err:  # noqa: BLE001 - d500's own failure or a bad hand-over, as a line
        text = describe(err)
        _failed(order, run, text)
        try:
            conn.send(("error", text))
        except (OSError, ValueError):
            pass


def _judge(order: Order, run: Any, ranks: Ranks) -> None:
    """The run: level 2's loop over the ranks, their figures, the record, the result to rank 0."""
    from d500 import backends
    from d500.distributed import figures as figs
    from d500.distributed.loop import layout
    from d500.provenance import LoadWatch
    from d500.training.data import dataset as datasets
    from d500.training.trainer import Judge as Model
    from d500.training.trainer import _supervise, missed_figures, recorded

    wl, entry = order.workload, order.entry
    shape, classes = datasets.shape_of(wl.dataset)
    onnx_model = wl.build_model(order.seed, shape, classes)
    model = Model(backends.get(order.backend), onnx_model)
    stages = least = peaks = None  # judge's figures: bytes held, sent, held at a peak
    spec = order.spec
    if spec.pipeline > 1 or spec.tensor > 1 or spec.shard == "zero3":  # ranks each hold a
        from d500.distributed.pipeline.audit import Audit  # part: audited, memory checked
        ranks.audit = Audit(model, order.global_batch, order.seed, wl.drop_last)
        if spec.pipeline > 1:
            from d500.distributed.pipeline.partition import least_sent
            from d500.distributed.pipeline.partition import stage_bytes as held
        elif spec.tensor > 1:
            from d500.distributed.tensor.split import least_sent
            from d500.distributed.tensor.split import split_bytes as held
        else:  # ZeRO-3: each rank its rows of the judge's own copy of the model, and a layer
            from d500.distributed.schemes.zero3 import least_sent, peak_bytes
            from d500.distributed.schemes.zero3 import shard_bytes as held
            peaks = peak_bytes(onnx_model, spec, order.world_size)
        stages = held(onnx_model, spec, order.world_size)
        ranks.resumed = order.resumed  # a resume checked against what the judge saw
        if spec.shard == "zero3" or wl.drop_last:  # bytes checked: every step a whole batch
            least = least_sent(onnx_model, spec, order.world_size, order.global_batch)
    ranks.ready()
    watch = LoadWatch(root=job_root())  # the ranks' CPU on this host: measured, not reported
    checkpoints = None
    if order.checkpoint_every:
        from d500.training.resume import Checkpoints
        checkpoints = Checkpoints(order.checkpoint_every)
    from d500.training.resume import opened
    opened(run, run.ledger, checkpoints, order.resumed,
           {"workload": wl.name, "submission": entry.name, "backend": order.backend,
            "seed": order.seed, "world_size": order.world_size,
            "grid": order.spec.dims(order.world_size)})  # each piece's place (resuming.fits)
    with _progress(order) as bar:  # (the ranks are sent no validation figure to show one)
        try:
            figures, status, why = _supervise(run, wl, entry.recipe, order.seed, order.data_dir,
                                              bar, ranks, model, layout(order),
                                              checkpoints=checkpoints, resume=order.resumed,
                                              watch=watch)
        except Diverged as err:
            status, why, figures = "diverged", str(err), missed_figures(wl)
            ranks.finish(False)
    stats = ranks.stats()
    losses = [r.loss_sum / r.loss_count for r in stats if r.loss_count]
    figures.pop("train_loss", None)
    if losses:
        figures["train_loss"] = float(sum(losses) / len(losses))
    held = sum(a.nbytes for a in model.trainer.parameters().values())  # memory claims' check
    bubble = None
    if order.spec.pipeline > 1:  # the judge's own theory, not the ranks'
        from d500.distributed.pipeline.schedule import bubble as theory
        bubble = theory(order.spec.pipeline, order.spec.micro_batches)
    figures = recorded({**figures, **figs.aggregate(stats, held, stages, least,
                                                        peaks, bubble)})
    figures.update(figs.scaling(run.ledger, run.id, wl, entry.name, order.backend,
                                order.world_size, figures.get("time_to_accuracy", math.inf)))
    details = {**_details(order), "ranks": figs.details(stats),
               "oversubscribed": _oversubscribed(stats),
               "load_average": _load(watch, stats),
               "scheme_figures": stats[0].scheme if stats else {},
               "scheme_details": stats[0].scheme_details if stats else {}}
    if ranks.audit is not None:
        details["audited_steps"] = ranks.audit.audited
    if ranks.tree is not None and (broken := ranks.tree.broken()):  # (at each hold too)
        raise Escaped(broken)
    run.finish(status, figures=figures, error=why or None, details=details)
    ranks.conn.send(("result", status, why, figures))


def _progress(order: Order) -> Any:
    """The run's progress bar on stderr (console.progress_bar) where rank 0's command shows one,
    else a context of None."""
    if not order.progress:
        return contextlib.nullcontext()
    from d500.training.console import progress_bar
    return progress_bar(f"{order.workload.name} / {order.entry.name} / {order.backend} "
                        f"x{order.world_size} ranks seed {order.seed}")


def _open(order: Order) -> Any:
    """The run in the ledger, its provenance recording rank 0's thread count (which the judge's
    own evaluations use too)."""
    from d500 import threads
    from d500.ledger import Ledger
    if order.threads is not None:
        threads.configure(modules=threads.frameworks([order.backend]),
                          fallback=(order.threads["count"], order.threads["set_by"]))
    wl, entry = order.workload, order.entry
    ledger = Ledger(order.ledger_path)
    if order.stamp is not None:
        from d500.competition.reproduce_job import Stamped
        ledger = Stamped(ledger, order.stamp)
    return ledger.start_run(level=wl.level, workload=wl.name, submission=entry.name,
                            backend=order.backend, seed=order.seed,
                            hyperparameters=hyperparameters(order), workload_file=wl.path,
                            submission_files=list(entry.files), group=order.group or None,
                            rank=0, world_size=order.world_size, begin=False,
                            parent=None if order.resumed is None else order.resumed.parent)


def hyperparameters(order: Any) -> dict[str, Any]:
    """What a level-3 run logs as its hyperparameters: the recipe's, its global batch and each
    data rank's share, and its distributed spec (`order`: an Order, or a distributed Job)."""
    return {**order.entry.recipe.hyperparameters_logged(), "batch_size": order.global_batch,
            "per_rank_batch_size": math.ceil(order.global_batch / data_ranks(order)),
            **order.spec.logged()}


def data_ranks(order: Any) -> int:
    """The ranks that share each global batch (spec.data_ranks)."""
    from d500.distributed.spec import data_ranks as ranks
    world = order.world_size if hasattr(order, "world_size") else order.comm.size
    return ranks(world, order.spec.logged())


def _details(order: Order) -> dict[str, Any]:
    wl = order.workload
    return {"target": wl.target, "target_metric": wl.target_metric,
            "world_size": order.world_size, "global_batch": order.global_batch,
            "batch_mode": wl.batch_mode, "scheme": order.spec.scheme,
            "compressor": order.spec.compressor}


def _failed(order: Order, run: Any, why: str, gone: bool = False,
            interrupted: bool = False) -> None:
    """Record the run failed (once: a run already finished stays as it was); `gone`: a rank was
    lost (details "rank_lost": its last checkpoint may be resumed, d500.training.resume);
    `interrupted`: stopped by Ctrl-C, recorded so."""
    if run is None:
        return
    from d500.training.trainer import missed_figures
    run.finish("interrupted" if interrupted else "failed", figures=missed_figures(order.workload),
               error=why,
               details={**_details(order), **({"rank_lost": True} if gone else {})})


def _ack(lost: Any) -> None:
    try:
        lost.send(("recorded",))
    except (OSError, ValueError):
        pass


def _oversubscribed(ranks: list[Any]) -> bool:
    """Whether some host ran more ranks than it has cores (say so beside the figures)."""
    from d500.provenance import usable_cores
    here = sum(1 for r in ranks if r.host == socket.gethostname())
    return here > usable_cores()


def _tree() -> JobTree | None:
    """This host's ranks behind their keepers, under `job_root` (the judge in a process of its
    own under a launcher, on Linux), else None."""
    from d500.distributed.launch import launched_by_mpi
    root = job_root()
    if (threading.current_thread() is not threading.main_thread() or not launched_by_mpi()
            or not os.path.isdir("/proc/self/task")):
        return None
    return JobTree.found(root)


@functools.cache
def job_root() -> int:
    """The process whose tree holds this job's processes on this host, the judge's included:
    under a launcher, the proxy that started the local ranks (above rank 0's keeper and the
    process the proxy waits on, d500.children.keep; the judge is rank 0's child, or its helper's,
    d500.distributed.cover), else rank 0. Their
    CPU is read from /proc, not taken from the ranks' word: the entry's code runs in them, and a
    rank that reported less CPU than it took made its own work others' load, an idle machine
    loaded, and reproduce's time tolerance wider. Found once, as the judge starts (`main`),
    before any rank runs the entry's code (which could rename its own command line)."""
    from d500.distributed.launch import launched_by_mpi
    from d500.provenance import cmdline_of, parent_of
    rank0 = os.getppid()
    if not launched_by_mpi():
        return rank0
    up, line = parent_of(rank0), cmdline_of(rank0)
    for _ in range(3):  # rank 0 (where the parent is its helper), its keeper and the process
        if up is not None and line is not None and cmdline_of(up) == line:  # hydra waits on:
            up = parent_of(up)  # forks of rank 0
    return up or rank0


def _load(watch: Any, ranks: list[Any]) -> dict[str, Any]:
    """LoadWatch's record (the job's process tree on this host its own: `job_root`), with this
    job's ranks on this host taken out of the load averages' others too, a core each (each
    keeps a core busy, computing or polling)."""
    from d500.provenance import is_loaded
    out = watch.finish()
    here = sum(1 for r in ranks if r.host == socket.gethostname())
    others = [None if v is None else round(max(0.0, v - here), 2) for v in out["others"]]
    out.update(others=others, job_ranks_here=here)
    out["loaded"] = is_loaded(out)
    return out
