"""One level-2 training run: the workload's ONNX model as a backend translated it, trained by a
submission's recipe until the validation target is met or the budget is spent, every evaluation
recorded in the ledger and the MLLOG.

The judge and the entry live in different processes. This process (the supervisor) holds the
clock, the validation and test splits, the evaluation, the stop rule, the ledger and the MLLOG;
a worker process (d500.training.worker) holds the model, the optimizer (the submission's code)
and the training split, and trains chunk by chunk: the steps up to the next evaluation or the
end of the epoch. Where an evaluation follows it hands the model's parameters over, and the
supervisor evaluates them on its own copy of the model (Judge). The supervisor times what it
observes (each chunk's round trip), never what the worker reports. Level 3's judge runs the same
loop (`_supervise`) with the MPI ranks, behind rank 0, as its trainee (d500.distributed.judge).

The clock (MLPerf's run_start) starts after the worker translated the model and built the
optimizer, and before the first data is touched: dataset loading, batching, the transfer of the
training split to the worker and validation are inside time_to_accuracy. Test accuracy (no
decision reads it) is measured after the run on a copy of each evaluated model, so the clock is
never paused while the entry's code runs (d500.training.heldout; where that cannot wait, the
clock is paused and the entry's processes stopped, Trainee.hold). A NaN or infinite loss ends
the run `diverged`, a spent budget `missed` (the worker is told to stop mid-chunk); both score
infinity and stay in the ledger. The load averages at the run's start and end are recorded with
it (details "load_average"), as levels 0 and 1 record them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from d500 import mllog
from d500.errors import D500Error, Diverged, UsageError, describe
from d500.training.precision import MLLOG as PRECISION_NAMES
from d500.training.recipe import Recipe
from d500.training.workloads import Workload

EVAL_BATCH = 1024  # samples per forward pass when evaluating (does not change the accuracy)
EVAL_TOKENS = 8192  # tokens per forward pass when evaluating a language model
BATCH_KEY = "d500_global_batch_size"  # MLLOG: an epoch's batch, where a batch_schedule grows it
Progress = Callable[[dict[str, Any]], None]


@dataclass
class Result:
    """What one training run ended with (also in the ledger, under `run_id`)."""

    run_id: int
    status: str  # succeeded | missed | diverged | failed | interrupted
    figures: dict[str, float] = field(default_factory=dict)
    error: str = ""


@dataclass
class Clock:
    """Run time with the test evaluations taken out, and where the rest of it went; `read` is
    the supervisor's time source (time.perf_counter; a test may drive it)."""

    start: float = field(default_factory=time.perf_counter)
    paused: float = 0.0
    data: float = 0.0
    train: float = 0.0
    evaluation: float = 0.0
    read: Callable[[], float] = time.perf_counter
    before: float = 0.0  # what a resumed run's earlier segments took (d500.training.resume)

    def now(self) -> float:
        return self.read() - self.start - self.paused + self.before


SPLIT = {"train_time": "train", "eval_time": "evaluation", "data_time": "data"}  # figure: Clock


def accuracy(predict: Callable[[dict[str, np.ndarray]], np.ndarray], x: np.ndarray,
             y: np.ndarray) -> float:
    """Fraction of samples whose largest logit is the label."""
    correct = 0
    for i in range(0, len(y), EVAL_BATCH):
        logits = predict({"input": x[i:i + EVAL_BATCH]})
        correct += int(np.sum(np.argmax(logits, axis=1) == y[i:i + EVAL_BATCH]))
    return correct / len(y)


def log_perplexity(predict: Callable[..., np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    """Mean next-token cross-entropy (nats) over every position of the windows x [M, T] (labels
    y [M, T]): the model's `loss` output per batch of EVAL_TOKENS tokens, weighted by its size."""
    rows = max(1, EVAL_TOKENS // x.shape[1])
    total = 0.0
    for i in range(0, len(y), rows):
        loss = predict({"input": x[i:i + rows], "labels": y[i:i + rows]}, "loss")
        total += float(loss) * len(y[i:i + rows])
    return total / len(y)


QUALITY = {"accuracy": accuracy, "log_perplexity": log_perplexity}  # Workload.quality -> measure


def train(workload: Workload, recipe: Recipe, backend: str, seed: int, *, ledger: Any = None,
          data_dir: str | None = None, submission: str = "", submission_files: list = (),
          study: Any = None, trial: int | None = None, progress: Progress | None = None,
          run_kwargs: dict[str, Any] | None = None, checkpoints: Any = None,
          resume: Any = None) -> Result:
    """Run one training run and record it; returns its status and figures. Bad input (a recipe
    outside the rules, an unknown backend, a model no trainer can train: see `preflight`)
    raises before any run is recorded; anything that goes wrong after the run opened (a crash
    in the submission's optimizer, an operator the backend lacks, a corrupt dataset file) ends
    the run `failed` with the error. `checkpoints` (d500.training.resume.Checkpoints): write
    one every K epochs; `resume` (resume.Resumed, from resume.plan): continue a killed run."""
    from d500.ledger import Ledger
    from d500.provenance import LoadWatch

    backend_cls, model = ready(workload, recipe, backend, data_dir, seed)
    ledger = ledger if ledger is not None else Ledger()
    hyper = recipe.hyperparameters_logged()
    details: dict[str, Any] = {"target": workload.target,
                               "target_metric": workload.target_metric}
    watch = LoadWatch()  # how busy the machine was while this run trained
    world = (run_kwargs or {}).get("world_size")

    def ended() -> dict[str, Any]:
        return {**details, "load_average": load_record(watch, world)}

    with ledger.start_run(level=workload.level, workload=workload.name, submission=submission,
                          backend=backend, seed=seed, hyperparameters=hyper,
                          workload_file=workload.path, submission_files=list(submission_files),
                          study=study, trial=trial, begin=False,
                          parent=None if resume is None else resume.parent,
                          **(run_kwargs or {})) as run:
        from d500.training.resume import opened
        opened(run, ledger, checkpoints, resume, {"workload": workload.name, "seed": seed,
                                                  "submission": submission, "backend": backend})
        try:
            figures, status, error = _train(run, workload, recipe, backend_cls, model, seed,
                                            data_dir, progress, checkpoints, resume, watch)
        except Diverged as err:
            run.finish("diverged", figures=missed_figures(workload), error=str(err),
                       details=ended())
            return Result(run.id, "diverged", error=str(err))
        except KeyboardInterrupt:
            raise
        except Exception as err:  # noqa: BLE001 - the submission's or backend's failure: a run
            text = describe(err)
            run.finish("failed", figures=missed_figures(workload), error=text, details=ended())
            return Result(run.id, "failed", error=text)
        run.finish(status, figures=figures, error=error or None, details=ended())
        return Result(run.id, status, figures, error)


def preflight(workload: Workload, recipe: Recipe, backend: str, data_dir: str | None) -> Any:
    """The checks `train` makes before it records anything (a recipe inside the rules, the
    dataset's files present, a trainable backend, a model every trainer can train:
    d500.training.trainable says which model problems are the workload's); returns the backend
    class. Deterministic, so every MPI rank given the same input fails the same way before any
    communication."""
    return ready(workload, recipe, backend, data_dir, seed=0)[0]


def within_rules(workload: Workload, recipe: Recipe, data_dir: str | None) -> None:
    """`preflight`'s checks that load no framework: the recipe inside the workload's rules
    (level 3: a fixed batch, fp32), the dataset's files present."""
    from d500.training.data.dataset import check_present
    if workload.level == 3 and recipe.batch_schedule is not None:
        raise UsageError(f"{recipe.where}: level 3 trains at a fixed global batch (so far); "
                         f"field 'batch_schedule' grows the batch at level 2")
    recipe.check(workload)
    if workload.level == 3 and recipe.precision != "fp32":
        raise UsageError(f"{recipe.where}: level 3 trains in fp32 only (so far); precision "
                         f"{recipe.precision} trains at level 2")
    check_present(workload.dataset, data_dir)


def ready(workload: Workload, recipe: Recipe, backend: str, data_dir: str | None, seed: int
          ) -> tuple[Any, Any]:
    """`preflight`'s checks with the model of the run of `seed` built and checked: (the backend
    class, the model), so that a run builds its model once."""
    from d500 import backends
    from d500.training.trainable import trainable_model

    within_rules(workload, recipe, data_dir)
    backend_cls = backends.get(backend)
    if not getattr(backend_cls, "trainable", True):
        raise D500Error(f"backend '{backend}' cannot train (inference only); choose one of "
                        f"the trainable backends ({', '.join(backends.trainable())}; their "
                        f"modes: d500 backends)")
    from d500.training.precision import check_backend
    check_backend(recipe.precision, backend_cls)
    return backend_cls, trainable_model(workload, seed)


def load_record(watch: Any, world_size: int | None = None) -> dict[str, Any]:
    """The run's LoadWatch record. In a parallel tuning (`world_size` > 1) this job's other
    ranks on this host train beside it, each on up to the configured thread count: their load
    is not other processes' (d500.provenance.LoadWatch.finish's job_load)."""
    job = 0.0
    if world_size is not None and world_size > 1:
        from d500 import threads
        from d500.distributed.launch import local_ranks
        count = (threads.recorded() or {}).get("count") or 1
        job = float((min(local_ranks(), world_size) - 1) * count)
    return watch.finish(job)


def missed_figures(workload: Workload) -> dict[str, float]:
    return {"time_to_accuracy": math.inf} if "time_to_accuracy" in workload.metrics else {}


def _train(run: Any, workload: Workload, recipe: Recipe, backend_cls: Any, model: Any,
           seed: int, data_dir: str | None, progress: Progress | None, checkpoints: Any = None,
           resume: Any = None, watch: Any = None) -> tuple[dict[str, float], str, str]:
    """The supervisor's side of a run (its worker, d500.training.worker, trains)."""
    from d500 import threads
    from d500.training.worker import Job, Worker

    # -- init: no data touched; the worker translates the model and builds the optimizer (the
    # entry's code) while this process builds its own copy of the model to evaluate with
    job = Job(model.SerializeToString(), backend_cls.name, recipe, seed, threads.recorded(),
              workload.drop_last)
    worker = Worker(job)
    try:
        from d500.training import warmup
        began = time.perf_counter()
        judge = Judge(backend_cls, model)
        worker.warmup = warmup.bound(time.perf_counter() - began, recipe.batch_size,
                                     workload.max_seconds)
        worker.ready()
        worker.share(judge.shapes, judge.dtypes)  # the model comes back in shared memory
        return _supervise(run, workload, recipe, seed, data_dir, progress, worker, judge,
                          checkpoints=checkpoints, resume=resume, watch=watch)
    finally:
        worker.close()


class Judge:
    """The supervisor's copy of the model: it evaluates the parameters the worker hands over."""

    def __init__(self, backend_cls: Any, model: Any):
        from d500.training.optimizers import make
        self.backend_cls = backend_cls
        self.trainer = backend_cls.prepare(model).trainer(make("sgd", lr=1.0), loss="loss")
        from d500.training import warmup  # its first evaluation's code paths, before the clock
        self.trainer.predict(warmup.zeros(model, warmup.ROWS))
        own = {**self.trainer.parameters(), **self.trainer.buffers()}
        self.shapes = {n: tuple(np.shape(v)) for n, v in own.items()}  # what every hand-over
        self.dtypes = {n: np.asarray(v).dtype for n, v in own.items()}  # must match, or becomes
        # NumPy views of its own parameters (None where the backend has none): a hand-over is
        # copied into them, a fraction of set_parameters' cost (benchmarks/isolation.py --case
        # handover), which the in-process loop never paid
        self.views = self.trainer.parameter_views()

    def load(self, state: dict[str, np.ndarray]) -> None:
        """The worker's model, checked name by name against this one and cast to its dtypes
        before either write (views or set_parameters), so that both paths are given the same
        arrays (tests/training/test_judge_load.py holds them equal on every backend)."""
        t = self.trainer
        if not isinstance(state, dict):
            raise D500Error(f"the worker handed over a {type(state).__name__}, not the model")
        values = {}
        for name, shape in self.shapes.items():
            if name not in state:
                raise D500Error(f"the worker handed over no value for '{name}'")
            value = np.asarray(state[name])
            if value.shape != shape:
                raise D500Error(f"the worker handed over '{name}' with shape "
                                f"{value.shape}; the model's is {shape}")
            if value.dtype.kind not in "biuf":
                raise D500Error(f"the worker handed over '{name}' as {value.dtype}, not as "
                                f"numbers")
            values[name] = value.astype(self.dtypes[name], copy=False)
        if self.views is None:
            t.set_parameters({n: values[n] for n in t.parameter_names})
        for name, view in (self.views or {}).items():
            np.copyto(view, values[name])
        if t.buffer_names:
            t.set_buffers({n: values[n] for n in t.buffer_names})

    def predict(self, feeds: dict[str, np.ndarray], output: str = "logits") -> np.ndarray:
        return self.trainer.predict(feeds, output)

    def keep(self) -> dict[str, np.ndarray]:
        """A copy of the model it holds now, for `load` later (d500.training.heldout)."""
        t = self.trainer
        if self.views is not None:
            kept = {n: np.array(v) for n, v in self.views.items()}
        else:
            kept = t.parameters()
        return {**kept, **t.buffers()}


@dataclass
class Layout:
    """How the trainee splits each step: its global batch, one process's share of it, and the
    MLLOG keys that describe that (level 3: ranks; level 2: one process, the recipe's batch)."""

    batch: int
    micro_batch: int | None = None
    keys: Callable[[Any], None] | None = None  # logs the layout's own MLLOG keys


def _supervise(run: Any, workload: Workload, recipe: Recipe, seed: int, data_dir: str | None,
               progress: Progress | None, worker: Any, judge: Judge,
               layout: Layout | None = None, checkpoints: Any = None, resume: Any = None,
               watch: Any = None) -> tuple[dict[str, float], str, str]:
    """The judge's loop, at level 2 and 3 alike: the clock, the data, chunk after chunk of
    training by `worker` (d500.training.worker's protocol), the evaluations and the stop rule;
    returns (figures, status, why). Raises Diverged at a non-finite loss. It may write
    `checkpoints` and start from `resume`'s (d500.training.resume). `watch` (a LoadWatch) starts
    again with the clock: reproduce judges times by the load beside what was timed."""
    from d500.training.batch_schedule import Plan, batches
    from d500.training.data import dataset as datasets

    layout = layout or Layout(recipe.batch_size)
    shape, _ = datasets.shape_of(workload.dataset)
    log = run.mllog
    share = getattr(worker, "share_data", None)  # a Worker's: the training split's shelf
    arrays = datasets.train_layout(workload.dataset)
    if share is not None and arrays is not None:
        share(*arrays)
    from d500.training.cpu import Meter
    # the CPU time the entry's processes use from here (cpu.BOUND), read just before the clock
    # (the worker waits for its data meanwhile): a walk of /proc the loop before the split
    # never made, ~0.3 ms of digits-mlp's time to accuracy when it was read on the clock; level
    # 3's ranks (d500.distributed.judge.Ranks) bring their own, which judges each rank alone too
    meter = worker.meter() if hasattr(worker, "meter") else Meter(worker)
    # each evaluation's figure of the held-out split waits in the judge's memory until the run
    # ends: the entry's code may read the log's file (the line put back at its place then)
    log.withhold(mllog.EVAL_ACCURACY)
    clock = Clock(start=run.begin())  # init_stop, run_start: the clock runs from here
    if watch is not None:  # the load beside what the clock times, not beside the setup
        watch.restart()
    if resume is not None:
        clock.before = resume.before  # every earlier segment's time, its checkpoint read too
    heart = None
    if checkpoints is not None or resume is not None:
        from d500.training.resume import Heartbeat
        heart = Heartbeat(run.dir)

    # -- data, inside the clock: the worker gets the training split only
    t0 = clock.read()
    parts, _ = datasets.parts(workload.dataset, data_dir)
    from d500.training.heldout import Pending
    tests = Pending(judge, lambda *a: QUALITY[workload.quality](*a), parts.test.x, parts.test.y,
                    f"test_{workload.quality}", f"val_{workload.quality}")
    # each epoch's batch (a recipe's batch_schedule grows it) and steps: the judge's decision
    plan = Plan.of(batches(recipe.growth(), layout.batch, workload.max_epochs),
                   len(parts.train.y), workload.drop_last)
    total_steps = plan.total
    meter.timed(worker.give, parts.train.x, parts.train.y, total_steps)
    from d500.training import compiling  # what a compiling mode's cache held at the start
    compiled = {"before": compiling.cached_programs(judge.backend_cls), "figures": {}}
    clock.data += clock.read() - t0
    log_run_keys(log, workload, recipe, len(parts.train.y), len(parts.validation.y), shape,
                 layout.micro_batch)
    if layout.keys is not None:
        layout.keys(log)

    state: dict[str, Any] = {"step": 0, "losses": [], "val": None, "reached": None,
                             "test_at_target": None, "test": None, "evaluated": None,
                             "loaded": None}
    begin = 0
    if resume is not None:  # on the clock: the worker takes the checkpoint's state
        meter.timed(worker.restore, resume.state)
        state.update(step=int(resume.meta["step"]), **resume.meta["judge"])
        begin = resume.epoch
        # the training, evaluation and data time up to the checkpoint: the samples it counts
        # from step 0 were trained in them, not in this segment alone (samples_per_second)
        for name, value in (resume.meta.get("clock") or {}).items():
            if name in SPLIT and isinstance(value, (int, float)) and math.isfinite(value):
                setattr(clock, SPLIT[name], getattr(clock, SPLIT[name]) + max(0.0, value))

    def save(epoch: int) -> None:
        """A checkpoint after `epoch` epochs, on the clock, its sha256 in the ledger at once."""
        from d500.training import checkpoint
        from d500.training import resume as resuming
        held_tests()  # (its figures in the checkpoint: a resumed run goes on from them)
        t = clock.read()
        got = meter.timed(worker.save)
        # the names and shapes checked as at an evaluation (level 3, ranks holding pieces of
        # the model: the whole one, gathered as for an evaluation, d500.distributed.resuming)
        judge.load(got.get("whole", got["model"]))
        state["loaded"] = state["step"]
        judged = {k: state[k] for k in ("losses", "val", "test", "evaluated")}
        split = {"train_time": clock.train, "eval_time": clock.evaluation,
                 "data_time": clock.data}  # a resume carries them on (SPLIT)
        meta = {**checkpoints.identity, "step": state["step"], "judge": judged,
                "every": checkpoints.every, "clock": split}
        path, digest = checkpoint.write(run.dir / resuming.FOLDER, epoch, got, meta)
        seen = {}  # ranks holding pieces: what the judge saw, for a resume's check (the ledger's)
        if "whole" in got:
            from d500.distributed.resuming import digest as whole
            seen[resuming.WHOLE] = whole(got)
        checkpoints.written.append({"epoch": epoch, "step": state["step"],
                                    "file": run.store_path(path), "sha256": digest, **seen,
                                    "seconds": clock.read() - t, "clock": clock.now(),
                                    **split})
        resuming.record(run, checkpoints.written)
        heart.beat(clock.now(), force=True)

    def evaluate(epoch: float) -> bool:
        """Validation, on the clock, the model kept for its test accuracy (measured after the
        run, d500.training.heldout); True when the target is met."""
        if state["loaded"] != state["step"]:
            raise D500Error(f"the judge holds the model of step {state['loaded']}, not of step "
                            f"{state['step']}, at an evaluation")
        meta = {mllog.EPOCH_NUM: epoch, mllog.SAMPLES_COUNT: plan.samples(state["step"])}
        log.start(mllog.EVAL_START, metadata=meta)
        t = clock.read()
        measure = QUALITY[workload.quality]
        val = measure(judge.predict, parts.validation.x, parts.validation.y)
        clock.evaluation += clock.read() - t
        log.event(mllog.EVAL_ACCURACY, val, metadata=meta)
        at, stamp = clock.now(), time.time() * 1e3  # eval_stop at the clock's reading
        log.end(mllog.EVAL_STOP, metadata=meta, time_ms=stamp)
        losses = state["losses"]
        train_loss = float(np.mean(losses)) if losses else math.nan
        state["losses"] = []
        state.update(val=val, train_loss=train_loss, evaluated=state["step"])
        met = workload.met(val) and state["reached"] is None
        if met:
            state["reached"] = (at, epoch, state["step"])
        metrics = {f"val_{workload.quality}": val}
        if math.isfinite(train_loss):
            metrics["train_loss"] = train_loss
        # its test accuracy and ledger row once the run ends (d500.training.heldout): the copy
        # of the model on the clock (tens of microseconds for digits-mlp), no pause, no hold
        tests.add({"step": state["step"], "epoch": epoch, "metrics": metrics, "wall_time": at,
                   "recorded": stamp / 1e3}, met)
        if tests.full:  # the kept models outgrew heldout.LIMIT: measured now, the clock paused
            held_tests(state["step"])
        return met

    paused_at: list[dict[str, int]] = []  # the evaluations the judge paused after (LIMIT)

    def held_tests(step: int | None = None) -> None:
        """The test accuracies not yet measured, now: the clock paused, the entry held; `step`:
        the evaluation's whose kept models outgrew heldout.LIMIT, in the run's details
        ("held_tests", as checkpoints are: d500 check reads the pause after it)."""
        t = clock.read()
        held = meter.hold()  # the entry computes nothing off the clock
        try:
            if step is not None:
                paused_at.append({"step": step, "bytes": tests.size})
                run.record(details={"held_tests": paused_at})
            tests.measure_all(run, state)
            log.release()  # their rows are in the ledger now: their lines in the log too (a
            log.withhold(mllog.EVAL_ACCURACY)  # killed run's log holds its rows' evaluations)
        finally:
            meter.release(held)
        clock.paused += clock.read() - t

    def remaining() -> float:
        now = clock.now()
        if heart is not None:
            heart.beat(now)
        return workload.max_seconds - now

    def shown() -> dict[str, Any]:
        """The last validation figure, for a progress display."""
        return {f"val_{workload.quality}": state["val"]}

    def tick(epoch: int) -> Callable[[int, float], None] | None:
        if progress is None:
            return None
        return lambda step, loss: progress({"step": step, "total": total_steps, "loss": loss,
                                            **shown(), "epoch": epoch + 1})

    with tests.written(run, state):  # every evaluation's test accuracy, its row
        every = workload.every_steps
        status, stop = "missed", False
        for epoch in range(begin, workload.max_epochs):
            log.start(mllog.EPOCH_START, metadata={mllog.EPOCH_NUM: epoch + 1})
            steps_per_epoch, batch = plan.steps[epoch], plan.batches[epoch]
            if not plan.fixed:  # the batch this epoch trains at (global_batch_size: the first)
                log.event(BATCH_KEY, batch, metadata={mllog.EPOCH_NUM: epoch + 1})
            first = 0
            while first < steps_per_epoch:  # chunks: the steps up to the next evaluation
                count = steps_per_epoch - first
                if every:
                    count = min(count, every - state["step"] % every)
                # the model is handed over only where an evaluation follows
                want = bool((every and (state["step"] + count) % every == 0) or (
                    workload.every_epochs and (epoch + 1) % workload.every_epochs == 0
                    and first + count == steps_per_epoch))
                t = clock.read()
                chunk = meter.timed(worker.train, epoch, first, count, remaining, tick(epoch), want,
                                    batch=batch)
                clock.train += clock.read() - t
                for loss in chunk.losses:
                    state["step"] += 1
                    if not math.isfinite(loss):
                        raise Diverged(f"the training loss is {loss} at step {state['step']} "
                                       f"(epoch {epoch + 1}){chunk.where}")
                    state["losses"].append(loss)
                if chunk.state is not None:
                    judge.load(chunk.state)
                    state["loaded"] = state["step"]
                if chunk.compiled is not None:  # its compile: on the clock, recorded apart too
                    compiled["figures"] = compiling.record(run, chunk.compiled, compiled["before"])
                if progress is not None and chunk.losses:
                    progress({"step": state["step"], "total": total_steps,
                              "loss": chunk.losses[-1], **shown(),
                              "epoch": epoch + 1})
                first += len(chunk.losses)
                if every and state["step"] % every == 0 and chunk.losses:
                    stop = evaluate(plan.epoch(state["step"]))
                stop = stop or chunk.stopped or remaining() < 0
                if stop or len(chunk.losses) < count:
                    stop = True
                    break
            log.end(mllog.EPOCH_STOP, metadata={mllog.EPOCH_NUM: epoch + 1})
            if state["reached"] is not None:
                break
            if not stop and workload.every_epochs and (epoch + 1) % workload.every_epochs == 0:
                if evaluate(float(epoch + 1)):
                    break
            if stop or remaining() < 0:
                break
            if checkpoints is not None and (epoch + 1) % checkpoints.every == 0 \
                    and epoch + 1 < workload.max_epochs:
                save(epoch + 1)
        last = state["reached"] is None and state["evaluated"] != state["step"]
        t = clock.read()
        if last:  # the final model (level 3: the scheme's), on the clock: time worked
            final = meter.timed(worker.finish, True)
        meter.check(run)  # fails a run whose entry used more CPU than its threads give
        if not last:  # in no figure, so no time worked either (an entry waiting there as long
            worker.finish(False)  # as it trained halved its threads' ratio: test_padded_meter)
        else:  # the end: always one last evaluation, the finish's time trained before it
            # (after the last evaluation, where the target was met or the last step evaluated, it
            # is in no figure: the split is of the time up to the last evaluation, and nothing
            # finish(False) does there is judged)
            clock.train += clock.read() - t
            judge.load(final)
            state["loaded"] = state["step"]
            evaluate(plan.epoch(state["step"]))
        if watch is not None:  # the clock stopped: the worker's threads' waits, while they live
            watch.mark()
        reached = state["reached"]
        if reached is not None and reached[0] <= workload.max_seconds:
            status = "succeeded"
    return ({**_figures(workload, state, clock, plan.samples(state["step"])),
             **compiled["figures"]}, status,
            _why(workload, state, status))


def _figures(workload: Workload, state: dict[str, Any], clock: Clock, samples: int
             ) -> dict[str, float]:
    figures = run_figures(workload, state, clock, samples)
    figures["train_loss"] = state.get("train_loss", math.nan)
    return recorded(figures)


def run_figures(workload: Workload, state: dict[str, Any], clock: Clock, samples: int
                ) -> dict[str, float]:
    """A run's figures (level 2, or level 3 with its global batch; `samples`: those trained, at
    each epoch's batch) unless it diverged: time, epochs and steps to the target (∞ when
    missed, or met after the time budget), the last validation and test accuracies, the test
    accuracy at the target, throughput and where the time up to the last evaluation went."""
    reached = state["reached"]
    if reached is not None and reached[0] > workload.max_seconds:
        reached = None  # met, but after the budget: a miss
    quality = workload.quality
    figures = {
        "time_to_accuracy": reached[0] if reached else math.inf,
        "epochs": reached[1] if reached else math.inf,
        "steps": float(reached[2]) if reached else math.inf,
        f"val_{quality}": state["val"],
        f"final_test_{quality}": state["test"],
        "samples_per_second": samples / clock.train if clock.train > 0 else math.nan,
        "train_time": clock.train,
        "eval_time": clock.evaluation,
        "data_time": clock.data,
    }
    if state["test_at_target"] is not None:
        figures[f"test_{quality}"] = state["test_at_target"]
        if quality == "log_perplexity":
            figures["test_perplexity"] = math.exp(state["test_at_target"])
    return figures


def recorded(figures: dict[str, Any]) -> dict[str, float]:
    """Every figure that has a value (the workload's `metrics` choose what the board shows)."""
    return {k: v for k, v in figures.items()
            if v is not None and not (isinstance(v, float) and math.isnan(v))}


def _why(workload: Workload, state: dict[str, Any], status: str) -> str:
    if status != "missed":
        return ""
    what = workload.quality.replace("_", "-")
    budget = f"the budget ({workload.max_epochs} epochs, {workload.max_seconds:g} s)"
    if state["val"] is not None and workload.met(state["val"]):  # the evaluation that ends it
        return (f"validation {what} {state['val']:.4f} after {state['step']} steps met the "
                f"target {workload.target} only at the evaluation after {budget} ran out")
    return (f"validation {what} {state['val']:.4f} after {state['step']} steps did not reach "
            f"the target {workload.target} within {budget}")


def log_run_keys(log: Any, workload: Workload, recipe: Recipe, train_samples: int,
                 eval_samples: int, shape: tuple[int, ...], micro_batch: int | None = None
                 ) -> None:
    """The MLPerf Training 6.1 keys that describe the run (the ledger logged the submission's
    and the seed; the optimizer's hyperparameters are logged as opt_* at start). `micro_batch`:
    one process's batch (level 3: a rank's share of the global batch)."""
    log.event(mllog.CACHE_CLEAR, False)  # d500 does not drop the OS page cache
    log.event(mllog.TRAIN_SAMPLES, train_samples)
    log.event(mllog.EVAL_SAMPLES, eval_samples)
    log.event(mllog.MICRO_BATCH_SIZE, recipe.batch_size if micro_batch is None else micro_batch)
    log.event(mllog.GRADIENT_ACCUMULATION_STEPS, 1)
    # the precision the worker's trainer reported and Worker.ready checked against the recipe
    low = PRECISION_NAMES[recipe.precision]
    log.event(mllog.PRECISION_LINEAR, low)
    if workload.text:  # attention's matmuls compute in the same precision
        log.event(mllog.PRECISION_ATTN, low)
    for key in (mllog.TENSOR_PARALLELISM, mllog.PIPELINE_PARALLELISM,
                mllog.CONTEXT_PARALLELISM, mllog.EXPERT_PARALLELISM):
        log.event(key, 1)  # one process holds the whole model
    log.event(mllog.CONFIG_FILENAME, workload.path.name)
    log.event("d500_target", workload.target, metadata={"metric": workload.target_metric})
