"""The worker: the process in which a level-2 run's entry code trains, apart from the judge.

    worker = Worker(Job(model_bytes, "torch", recipe, seed, threads.recorded(), drop_last=True))
    worker.ready()                                   # the model translated, the optimizer built
    worker.give(train_x, train_y, total_steps=1480)  # only now does it hold any data
    chunk = worker.train(epoch=0, first=0, count=37, remaining=lambda: 120.0, tick=None,
                         batch=32)
    chunk.losses, chunk.state                        # the model handed over for evaluation
    worker.close()

The worker holds the model, the optimizer (the submission's code: its file is imported only
here) and the training split, which the supervisor (d500.training.trainer) sends after its clock
started. It never holds the validation or test split, the ledger, the MLLOG or the clock that
scores the run: code that walks the stack or patches `time.perf_counter` finds none of them.
It is never forked from the supervisor, so nothing of the supervisor's memory is copied into it:
it is a fresh fork of d500's forkserver, which preloaded torch and holds nothing else, or a
spawned interpreter (d500.children), new for every run. It takes the supervisor's environment
from the job, and ends with its supervisor (PR_SET_PDEATHSIG on Linux; EOF on its pipe
elsewhere).

The protocol, over one multiprocessing Pipe: the supervisor sends the Job, where it can
("handover", layout, size) with a shared memory file's fd after it (d500.training.handover: the
worker then writes the model there and sends SHARED in its place) and ("shelf", layout, size)
with another's (the training split's: after the clock "data" then says SHARED for x and y, which
the worker reads there), ("data", x, y, total_steps), then ("train", epoch, first, count, want,
None, batch) per chunk (the steps up to the next evaluation at the batch the judge chose for the
epoch, d500.training.batch_schedule; `want`: hand the model over at its end; None: no figure of
the held-out split, the judge shows the progress) and ("stop",) when
the time budget runs out mid-chunk, and at the end ("finish", want); ("save",) and ("restore",
state) for checkpoints (d500.training.resume); the worker answers ("built",) then ("ready",)
(its warm-up between them: the judge bounds it, d500.training.warmup.bound), ("tick", step,
loss) at most every TICK seconds, ("trained", losses, state or None, stopped, where) at the end
of a chunk, ("state", state or None) to "finish", ("saved", state) and ("restored",), ("error",
line) when anything failed. What the worker says of its own time is never used: the supervisor
times each round trip itself, and from that predicts when the next is due, which decides only
when it looks (it spins a bounded while around a due chunk: d500.training.waiting; the worker
blocks for the answer, having readied the chunk it guesses comes next: d500.training.ahead).
Level 3 speaks the same protocol with its rank 0 (d500.distributed.judge), whose ranks train
together.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from d500 import children
from d500.errors import D500Error
from d500.training import handover, waiting

TICK = 0.25  # seconds between progress messages from the worker
GRACE = 30.0  # seconds a worker may take to stop after the budget ran out (one step's worth)
POLL = 0.005  # seconds between the worker's looks for a stop message (a look costs ~30 us)
# s the worker looks without sleeping for the first "train", which follows the data within
# ~0.3-0.6 ms (the judge logs the run's keys): woken from a blocking read it came 0.08-0.17 ms
# late, looking 0.05 (README "What the split costs")
FIRST = 0.001
START = 600.0  # seconds a worker may take to start and build the model and optimizer
# seconds a worker forked from the forkserver may take to be ready (~1 s; a spawned one, ~20 s
# at load 9) before a spawned worker replaces it: once, in a whole suite at load 8-12, a forked
# worker never became ready, and its run waited START
FORKED_READY = 120.0


class WorkerError(D500Error):
    """The worker failed: the submission's code or the backend raised, or the process ended."""


@dataclass
class Job:
    """What a worker needs to train one run (no validation or test data, by design)."""

    model: bytes  # the serialized ONNX model of the run
    backend: str
    recipe: Any  # d500.training.recipe.Recipe
    seed: int
    threads: dict[str, Any] | None  # the supervisor's d500.threads.recorded()
    drop_last: bool
    env: dict[str, str] | None = None  # the worker's environment (None: the supervisor's now)
    # s the worker looks past the judge's answer's due time (0: never, its default: a worker
    # spinning while the judge answered, SCHED_FIFO, starved the kernel's work on its CPU that
    # the judge's ledger commit waits for: +0.45 ms an evaluation, README "What the split costs")
    spin: float = 0.0


@dataclass
class Chunk:
    """What one chunk of training ended with: the losses of its steps, the model's parameters
    and running statistics by name (None when not asked for), whether the worker stopped early
    (budget, divergence), where a non-finite loss came from (level 3: " on rank N"), and what
    compiling the step cost (a compiling mode's Trainer.compile_record, else None)."""

    losses: list[float]
    state: dict[str, np.ndarray] | None
    stopped: bool
    where: str = ""
    compiled: dict[str, Any] | None = None  # a compiling mode's compile_record, as it says


class Trainee:
    """The supervisor's side of the protocol over `conn` (a worker process, or level 3's rank
    0); `grace`: seconds to stop after a stop message before the trainee is given up (None:
    wait for the end of its chunk)."""

    grace: float | None = GRACE
    spin = 0.0  # s a wait for a chunk looks past its due time (d500.training.waiting; 0: never)
    board: handover.Board | None = None  # where the model comes, when not pickled (a Worker's)
    shelf: handover.Board | None = None  # where the training split goes, when not pickled

    def __init__(self, conn: Any):
        self.conn = conn
        self.step_time: float | None = None  # s a step took in the last whole chunk, as timed here

    def hold(self) -> list[int]:
        """Stop the trainee's processes while the judge works off the clock (a Worker's, level
        3's ranks: d500.distributed.judge.Ranks); what `release` takes."""
        return []

    def release(self, held: list[int]) -> None:
        children.release(held)

    def cpu_seconds(self) -> tuple[float, dict[int, tuple[float, ...]]] | None:
        """CPU seconds the trainee's processes used so far, and each live thread's run and wait
        for a CPU (a Worker's, d500.children.cpu_seconds; None: not measured)."""
        return None

    whose = "the worker's threads"  # what `cpu_seconds` reads, as a failure's line says
    leeway = 1.0  # x d500.training.cpu's bound (level 3's ranks: d500's own threads besides)

    def allotment(self) -> tuple[int, str] | None:
        """The threads the processes `cpu_seconds` reads were given in all and the backend they
        train on (d500.training.cpu's bound); None: not measured."""
        return None

    def ready(self) -> None:
        """Wait until the worker built the model and the optimizer (a WorkerError if not);
        `precision` is then the one its trainer computes in (d500.training.precision)."""
        message = self._expect("ready", START)
        self.precision = str(message[1]) if len(message) > 1 else "fp32"

    def give(self, x: np.ndarray, y: np.ndarray, total_steps: int) -> None:
        """The training split (the only data the worker ever holds) and the run's step count
        (the learning-rate schedule's length): written on the shelf where one was shared and
        the split fits its layout exactly (SHARED sent in its place), else pickled."""
        shelf = self.shelf
        if shelf is not None and all(
                np.shape(a) == shelf.views[n].shape and np.asarray(a).dtype == shelf.views[n].dtype
                for n, a in (("x", x), ("y", y))) and shelf.put({"x": x, "y": y}):
            self.conn.send(("data", handover.SHARED, handover.SHARED, total_steps))
            return
        self.conn.send(("data", x, y, total_steps))

    def train(self, epoch: int, first: int, count: int, remaining: Callable[[], float],
              tick: Callable[[int, float], None] | None, want: bool = True,
              batch: int | None = None) -> Chunk:
        """Steps first..first+count-1 of `epoch` at `batch` samples each (the epoch's batch, as
        the judge decided it: the trainee takes it from this message and from nowhere else), the
        model handed over at the end if `want`;
        `remaining()` is the time budget left on the supervisor's clock: when it runs out the
        trainee is told to stop after its current step (and given up if it does not within
        `grace` s). The message's sixth field is None: it carried the last validation accuracy,
        a figure of the held-out split, which the entry's code read (the judge shows progress:
        tests/training/test_val_leak.py, tests/distributed/test_val_leak_mpi.py)."""
        sent = time.perf_counter()
        self.conn.send(("train", epoch, first, count, want, None, batch))
        # when the chunk should be back, from this side's timing of the last one: it decides
        # when the wait looks without sleeping (d500.training.waiting), never what is timed
        due = None if self.step_time is None or not self.spin else sent + count * self.step_time
        stop_sent = False
        while True:
            wait = self.grace if stop_sent else max(remaining(), 0.0)
            ready = (waiting.poll(self.conn, wait, due, self.spin) if due is not None
                     else self._poll(wait))
            if not ready:
                if stop_sent:
                    self.close()
                    raise WorkerError(f"the worker did not stop within {self.grace:g} s after "
                                      f"the time budget ran out")
                self.conn.send(("stop",))
                stop_sent = True
                continue
            message = self._receive()
            if message[0] == "tick":
                if tick is not None:
                    tick(message[1], message[2])
            elif message[0] == "trained":
                if len(message[1]) > count:  # its losses are the steps the judge counts
                    raise WorkerError(f"the worker answered {len(message[1])} steps for the "
                                      f"{count} it was asked to train")
                if not stop_sent and (message[3] or len(message[1]) < count
                                      and not _diverged(message[1])):
                    # only the judge's stop (or a non-finite loss) ends a chunk early: an early
                    # end moves the run's last evaluation to a step the entry chose
                    raise WorkerError(f"the worker stopped after {len(message[1])} of the "
                                      f"{count} steps it was asked to train, never told to "
                                      f"stop (tests/training/test_short_chunk.py)")
                if not stop_sent and len(message[1]) == count and count:
                    self.step_time = (time.perf_counter() - sent) / count
                return Chunk(list(message[1]), self._state(message[2]), stop_sent,
                             str(message[4]), message[5] if len(message) > 5 else None)
            else:
                raise WorkerError(f"the worker sent '{message[0]}' during training")

    def finish(self, want: bool) -> dict[str, np.ndarray] | None:
        """The end of training: the final model if `want` (level 3's schemes finish here)."""
        self.conn.send(("finish", want))
        return self._state(self._expect("state", START)[1])

    def save(self) -> dict[str, Any]:
        """The trainee's state for a checkpoint (d500.training.checkpoint.capture)."""
        self.conn.send(("save",))
        return self._expect("saved", START)[1]

    def restore(self, state: dict[str, Any]) -> tuple[Any, ...]:
        """Put a checkpoint's state back into the trainee (after `give`); its reply."""
        self.conn.send(("restore", state))
        return self._expect("restored", START)

    def close(self) -> None:
        raise NotImplementedError

    def _state(self, state: Any) -> Any:
        """A handed-over state as sent, or taken from the board where the message says so: the
        judge's own copy, checked against the board (d500.training.handover)."""
        if not (isinstance(state, str) and state == handover.SHARED):
            return state
        if self.board is None:
            raise WorkerError(f"{self._who} named a shared hand-over it was never given")
        try:
            return self.board.take()
        except handover.Changed:
            self.close()
            raise WorkerError(f"{self._who} wrote into the model it handed over after handing "
                              f"it over (the shared memory changed while the judge copied "
                              f"it)") from None

    def _poll(self, timeout: float | None) -> bool:
        return self.conn.poll(timeout)

    def _expect(self, what: str, timeout: float | None) -> tuple[Any, ...]:
        if not self._poll(timeout):
            self.close()
            raise WorkerError(f"the worker sent no '{what}' within {timeout:g} s")
        message = self._receive()
        if message[0] != what:
            raise WorkerError(f"the worker sent '{message[0]}' where '{what}' was due")
        return message

    def _receive(self) -> tuple[Any, ...]:
        from d500 import untrusted
        try:
            message = untrusted.receive(self.conn)  # its pickles may call nothing here
        except (EOFError, OSError):
            raise WorkerError(self._ended()) from None
        except untrusted.Forbidden as err:
            raise WorkerError(f"{self._who} {err}") from None
        if not isinstance(message, tuple) or not message or not isinstance(message[0], str):
            raise WorkerError(f"the worker sent a malformed message ({type(message).__name__})")
        if message[0] == "error":
            raise WorkerError(str(message[1]))
        return message

    def _ended(self) -> str:
        return "the worker ended without a word"

    _who = "the worker"  # how a message names the process at the other end


class Worker(Trainee):
    """The supervisor's handle on one worker process."""

    warmup: tuple[float, str] | None = None  # s its warm-up may take, and why (warmup.bound)

    def __init__(self, job: Job):
        if job.env is None:
            job = replace(job, env=children.environment())
        self.spin = waiting.CAP  # the judge looks for a due chunk without sleeping a while
        from d500.backends import framework
        known = framework(job.backend)  # (an unknown framework is spawned)
        self.job = job
        self._start(children.context([known[0] if known else job.backend]))

    def _start(self, ctx: Any) -> None:
        children.shield()
        conn, child = ctx.Pipe()
        super().__init__(conn)
        self.method = ctx.get_start_method()
        self.process = ctx.Process(target=main, args=(child,), name="d500-worker", daemon=True)
        children.start(self.process)  # ^C held till it ignores it
        child.close()
        try:  # the job goes over our pipe: a spawned child that dies while it reads its start-up
            self.conn.send(self.job)  # data can hang its parent when it exceeds a pipe buffer
        except (OSError, ValueError):
            pass  # the worker died at once: ready() says so

    def hold(self) -> list[int]:
        """Stop the entry's processes (SIGSTOP, d500.children.hold), waiting for the next chunk
        anyway, while the judge measures test accuracy off the clock: a thread the entry
        started computed on there (tests/training/test_paused_clock.py)."""
        return children.hold(self.process.pid) if sys.platform == "linux" else []

    def cpu_seconds(self) -> tuple[float, dict[int, tuple[float, ...]]] | None:
        """CPU seconds the entry's processes used so far, every thread of each, the reaped ones
        too, and each live thread's run and wait for a CPU (d500.children.cpu_seconds); None
        off Linux."""
        return children.cpu_seconds(self.process.pid) if sys.platform == "linux" else None

    def allotment(self) -> tuple[int, str] | None:
        """The thread count the run records (the supervisor's), the worker's backend."""
        count = (self.job.threads or {}).get("count")
        return (count, self.job.backend) if count else None

    def ready(self) -> None:
        """Wait until the worker built the model and the optimizer, then until its warm-up
        step is done, within `warmup` (d500.training.warmup.bound); a forked worker that built
        nothing within FORKED_READY s is replaced by a spawned one (said on stderr)."""
        if self.method == "forkserver" and not self._poll(FORKED_READY):
            children.end(self.conn, self.process, wait=1.0)
            sys.stderr.write(f"d500: a forked worker was not ready within {FORKED_READY:g} s; "
                             "starting a spawned one\n")
            self._start(children.context(method="spawn"))
        self._expect("built", START)
        seconds, why = self.warmup or (START, "the worker's start-up allowance")
        if not self._poll(min(seconds, START)):
            children.end(self.conn, self.process, wait=0.0)  # hung: it reads no "exit"
            recipe = self.job.recipe
            who = (f"{recipe.entry.file}: the optimizer {recipe.entry.class_name}"
                   if recipe.entry is not None else
                   f"{recipe.where}: the built-in optimizer '{recipe.optimizer_name}'")
            raise WorkerError(f"{who} did not finish its warm-up (one step of a copy of the "
                              f"model on zeros, before the clock) within "
                              f"{min(seconds, START):.3g} s ({why})")
        super().ready()
        want = self.job.recipe.precision
        if self.precision != want:  # what it computes in is what the run records, or no run
            self.close()
            raise WorkerError(f"the worker's trainer computes in {self.precision}, but the "
                              f"recipe says {want}")

    def share(self, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, Any]) -> None:
        """After `ready`, before the clock: a board for the model's arrays (the judge's shapes
        and dtypes), offered to the worker, which then hands the model over there
        (d500.training.handover); where the system has none, it goes pickled."""
        board = handover.Board.create(shapes, dtypes)
        if board is not None and handover.offer(self.conn, board):
            self.board = board
        elif board is not None:
            board.close()

    def share_data(self, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, Any]) -> None:
        """After `share`, before the clock: a shelf for the training split ("x" and "y" as the
        dataset gives them, d500.training.data.dataset.train_layout), its pages faulted in on
        both sides, offered to the worker, which reads the split there once `give` wrote it
        after the clock; the pickled send cost ~0.3 ms more of digits-mlp's time to accuracy
        (README "What the split costs")."""
        shelf = handover.Board.create(shapes, dtypes)
        if shelf is None:
            return
        shelf.touch(write=True)
        if handover.offer(self.conn, shelf, "shelf"):
            self.shelf = shelf
        else:
            shelf.close()

    def close(self) -> None:
        """End the worker (politely, then by force), and unmap its boards."""
        children.end(self.conn, self.process)
        for name in ("board", "shelf"):
            board = getattr(self, name)
            setattr(self, name, None)
            if board is not None:
                board.close()

    def _ended(self) -> str:
        self.process.join(timeout=5)
        return f"the worker process ended (exit code {self.process.exitcode}) without a word"


def main(conn: Any) -> None:
    """The worker process: receive the job, build, receive the training split, train chunk by
    chunk."""
    children.bound_to_parent()
    try:  # the job first: its environment names the results directory the split hides, its
        job = conn.recv()  # recipe the folder of the entry's file, which stays seen
    except (EOFError, OSError):
        os._exit(0)
    children.take_environment(job.env)
    entry = getattr(job.recipe, "entry", None)
    children.keep(shown=[] if entry is None else [os.path.dirname(os.path.abspath(entry.file))])
    children.confine()  # (keep first: a PID namespace needs the capabilities confine drops)
    from d500.errors import describe
    try:
        # imported before the clock: d500.training.data's first import (~20 ms) fell inside the
        # first timed chunk, a cost the loop before the split paid before its clock
        from d500.training import ahead as readying
        trainer = _build(job, lambda: conn.send(("built",)))
        conn.send(("ready", trainer.precision))  # what it computes in: the judge logs it
        message, board = conn.recv(), None
        if message[0] == "handover":  # where the model goes back (d500.training.handover)
            board = handover.accept(conn, message)
            # its pages faulted in and the way there run once (0.30 ms the first time, 0.01
            # after, digits-mlp), before the clock: the judge reads the board only when told
            _handed(trainer, board)
            message = conn.recv()
        shelf = None
        if message[0] == "shelf":  # where the training split comes (Worker.share_data)
            shelf = handover.accept(conn, message)
            shelf.touch(write=False)  # its pages mapped here before the clock
            readying.warm(len(shelf.views["y"]))  # the sampler's code, as warm as the judge's
            message = conn.recv()
        if message[0] != "data":
            return
        _, x, y, total_steps = message
        if shelf is not None and isinstance(x, str) and x == handover.SHARED:
            x, y = shelf.views["x"], shelf.views["y"]  # read in place, on the shelf
        lr_at, steps = job.recipe.schedule(total_steps), 0
        # the chunk the judge likely asks for next, readied while its word is awaited (the
        # judge logs the run's keys after the data, validates after a chunk): d500.training.ahead
        ahead = readying.Ahead(x, y, job.seed, job.drop_last)
        ahead.guess(0, 0, job.recipe.batch_size)
        waiting.poll(conn, None, time.perf_counter(), FIRST)  # once a run, then it blocks
        # the judge's answer to a chunk (its next message) is due when it came last time: with
        # job.spin, till then the wait blocks, then looks without sleeping a while
        # (d500.training.waiting); without (the default), it blocks
        handed, answer = None, 0.0  # when the last chunk went back; s its answer took
        while True:
            if handed is not None:
                waiting.poll(conn, None, handed + answer, job.spin)
            message = conn.recv()
            if handed is not None:
                answer, handed = time.perf_counter() - handed, None
            if message[0] == "stop":
                continue  # a stop that crossed the end of its chunk
            if message[0] == "finish":
                conn.send(("state", _handed(trainer, board) if message[1] else None))
                continue
            if message[0] in ("save", "restore"):  # a checkpoint (d500.training.checkpoint)
                from d500.training import checkpoint
                if message[0] == "save":
                    conn.send(("saved", checkpoint.capture(trainer, steps)))
                else:
                    steps = checkpoint.restore(trainer, message[1])
                    conn.send(("restored",))
                continue
            if message[0] != "train":
                return  # exit (or anything else): the supervisor is done with us
            _, epoch, first, count, want, _val, batch = message
            # the judge's epoch, steps and batch, as its message says, whatever was guessed
            # (each batch of the size the judge asked for, or the run fails)
            losses, stopped = [], False
            last = polled = time.perf_counter()
            for feeds in ahead.chunk(epoch, first, count, batch):
                now = time.perf_counter()
                if now - polled >= POLL:  # the only message that can come mid-chunk: stop
                    polled = now
                    if conn.poll():
                        conn.recv()
                        stopped = True
                        break
                loss = trainer.step(feeds, lr_at(steps))
                steps += 1
                losses.append(loss)
                if not math.isfinite(loss):
                    break
                if time.perf_counter() - last >= TICK:
                    conn.send(("tick", steps, loss))
                    last = time.perf_counter()
            conn.send(("trained", losses, _handed(trainer, board) if want else None, stopped,
                       "", trainer.compile_record()))
            handed = time.perf_counter()
            if not stopped and losses and math.isfinite(losses[-1]):
                ahead.after(epoch, first, count, batch)  # while the judge evaluates
    except (EOFError, OSError, KeyboardInterrupt):
        return  # the supervisor went away
    except Exception as err:  # noqa: BLE001 - the submission's or backend's failure, as a line
        try:
            conn.send(("error", describe(err)))
        except (OSError, ValueError):
            pass
    finally:  # nothing of the worker's outlives it: skip the interpreter's teardown (torch's
        sys.stdout.flush()  # took ~0.8 s of every run), not its named semaphores' unlinking
        sys.stderr.flush()
        _unlink_semaphores()
        os._exit(0)


def _unlink_semaphores() -> None:
    """Run what multiprocessing runs first at a process's exit (its finalizers of priority 0 and
    up, os._exit skips them): a SemLock's unlinks its named semaphore. torch.fx's tqdm makes one
    (tqdm's RLock) when torch:compiled compiles, and an entry may make its own; left, each ended
    in a "leaked semaphore" warning of multiprocessing's resource tracker when d500 exited."""
    from multiprocessing import util
    try:
        util._run_finalizers(0)
    except Exception:  # noqa: BLE001 - an entry's finalizer failing must not keep the worker
        pass


def _diverged(losses: Any) -> bool:
    """Whether a chunk's losses end in a non-finite one (a worker stops there on its own)."""
    try:
        return bool(losses) and not math.isfinite(float(losses[-1]))
    except (TypeError, ValueError, OverflowError):
        return False


def _state(trainer: Any) -> dict[str, np.ndarray]:
    """The model as the judge loads it: parameters and running statistics by name."""
    return {**trainer.parameters(), **trainer.buffers()}


def _handed(trainer: Any, board: handover.Board | None) -> dict[str, np.ndarray] | str:
    """The model for the judge: written on the board (its parameters straight from their
    NumPy views where the trainer has them), and SHARED said in its place; else pickled."""
    if board is not None:
        views = trainer.parameter_views()
        if board.put({**(views if views is not None else trainer.parameters()),
                      **trainer.buffers()}):
            return handover.SHARED
    return _state(trainer)


def _build(job: Job, built: Callable[[], None]) -> Any:
    """Threads as the supervisor set them, the model translated, the optimizer built (then
    `built()`: the supervisor times the warm-up from there), a copy of both stepped once on
    zeros (d500.training.warmup)."""
    import onnx

    from d500 import backends, threads
    if job.threads is not None:
        threads.configure(modules=threads.frameworks([job.backend]),
                          fallback=(job.threads["count"], job.threads["set_by"]))
    from d500.training import warmup
    backend_cls = backends.get(job.backend)
    model = onnx.load_from_string(job.model)
    exe = backend_cls.prepare(model)
    trainer = exe.trainer(job.recipe.optimizer(backend_cls.name), loss="loss",
                          native=job.recipe.native, precision=job.recipe.precision)
    built()
    warmup.train_step(job, backend_cls, model)  # before the clock, on zeros and a copy
    return trainer
