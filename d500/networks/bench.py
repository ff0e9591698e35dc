"""`d500 net bench`: per backend, load+translate time, first call, batch-1 latency, throughput at
the workload's batch size, training-step time and agreement with the reference; a ledger run each,
with the load averages at the start and end of the timing (d500.provenance.LoadWatch).

Backends are timed side by side (d500.timing.measure_interleaved), so machine noise hits them
alike. A backend that is not d500's own runs in a host process of its own and is timed in round
trips from this side of the pipe (d500.networks.hosted): its code never shares the judge's clock.
Every row's timed calls, hosted or not, are level 0's checked calls (each on its own shifted
input, its outputs checksummed: d500.networks.hosted.CheckedCall), so that every row pays the
check alike; a hosted row's calls are recomputed in a sample with the reference after timing.
A backend that cannot run the model, or whose outputs disagree with the reference beyond the
tolerance of d500.networks.compare, is recorded as a failed run (with its figures) and is
never ranked.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from d500.errors import ConfigError, UnsupportedOperator, describe, listed
from d500.networks import inputs as _inputs
from d500.networks.compare import compare
from d500.networks.workloads import Workload
from d500.provenance import LoadWatch
from d500.timing import Timing, measure_interleaved

if TYPE_CHECKING:
    from d500.backends.base import Backend

Progress = Callable[[str], Any]


@dataclass
class BackendBench:
    """One backend's figures for one workload, and the ledger run that holds them."""

    backend: str
    status: str = "running"  # succeeded | failed
    figures: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    unsupported: UnsupportedOperator | None = None
    run_id: int | None = None
    run: Any = field(default=None, repr=False)
    exe: Any = field(default=None, repr=False)
    train_exe: Any = field(default=None, repr=False)


@dataclass
class BenchResult:
    workload: Workload
    results: list[BackendBench]

    @property
    def exit_code(self) -> int:
        if any(r.unsupported is not None for r in self.results):
            return 2
        return 0 if all(r.status == "succeeded" for r in self.results) else 1


def _check_batch(workload: Workload, model: onnx.ModelProto) -> None:
    for spec in _inputs.specs(model):
        if spec.shape and isinstance(spec.shape[0], int) and spec.shape[0] != workload.batch_size:
            raise ConfigError(
                f"{workload.path}: field 'batch_size' is {workload.batch_size} but model input "
                f"'{spec.name}' has a fixed leading (batch) dimension of {spec.shape[0]}")


def bench(workload: Workload, backends: Sequence[str], *, ledger: Any = None,
          budget: float | None = None, progress: Progress | None = None,
          configure: Callable[[], None] | None = None) -> BenchResult:
    """Benchmark `workload` on `backends`; every backend's figures become a ledger run.
    `configure` (the CLI's thread counts, which import the frameworks) runs after the model's
    own checks, so that a workload file's mistake is said before a framework loads."""
    from d500 import backends as _backends
    from d500.ledger import Ledger
    from d500.networks import hosted

    _backends.host_plugins()  # a third-party backend is never imported here
    say = progress or (lambda text: None)
    ledger = ledger if ledger is not None else Ledger()
    budget = workload.budget if budget is None else budget
    say(f"{workload.name}: building the model")
    model, model_path = workload.onnx_model()
    _check_batch(workload, model)
    feeds1, feeds_b = bench_inputs(workload, model)
    train_model, train_path = training_model(workload, model, model_path)
    if configure is not None:
        configure()
    try:  # unknown or missing backends fail up front
        classes = {b: hosted.backend(b) for b in backends}
    except BaseException:
        hosted.close_all()
        raise
    hyper = {"batch_size": workload.batch_size, "budget": budget, "train": workload.train}
    results = [BackendBench(b) for b in backends]
    reference_out = None
    if "agreement" in workload.metrics and "reference" not in backends:
        reference_out = reference_outputs(model_path, feeds1, say, workload.name)
    # The reference goes first: its first call gives the outputs the others are compared with.
    order = sorted(results, key=lambda r: r.backend != "reference")
    watch = LoadWatch()  # how busy the machine was while the backends were timed
    try:
        for r in order:
            r.run = ledger.start_run(level=1, workload=workload.name, submission=r.backend,
                                     backend=r.backend, seed=workload.seed, hyperparameters=hyper,
                                     workload_file=workload.path, model_file=model_path)
            r.run_id = r.run.id
            r.details.update({"framework": classes[r.backend].framework,
                              "framework_version": classes[r.backend].version(),
                              "model": workload.model_label(), "inputs": {
                                  k: list(v.shape) for k, v in feeds1.items()}})
            if isinstance(classes[r.backend], hosted.HostedBackend):  # its host's word
                r.details["host_threads"] = classes[r.backend].host.ask("threads")
            outputs = first_call(r, classes[r.backend], model_path, feeds1,
                                 say=lambda text: say(f"{workload.name}: {text}"))
            if outputs is not None:
                compared = judge_agreement(r, outputs, reference_out, workload.metrics)
                if r.backend == "reference" and "agreement" in workload.metrics:
                    reference_out = compared
        alive = [r for r in results if r.status == "running"]
        time_inference(alive, feeds1, feeds_b, workload, budget, say)
        if workload.train:
            time_training(alive, classes, train_path, train_model, workload, budget, say)
        load = watch.finish()
        for r in results:
            if r.status == "running":
                r.status = "succeeded"
            r.details["load_average"] = load
            r.run.finish(r.status, figures=r.figures, details=r.details,
                         error=r.error or None)
    except BaseException as err:
        load = watch.finish()
        for r in results:
            r.details["load_average"] = load
            if r.run is not None and r.run.status == "running":
                status = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
                r.run.finish(status, figures=r.figures, details=r.details,
                             error=r.error or describe(err))
        raise
    finally:
        hosted.close_all()
    return BenchResult(workload, results)


# -- what can fail a backend, shared with `d500 reproduce` (d500.competition.reproduce_level1),
# -- which runs the same steps untimed (timed=False) so a reproduction fails for the same reasons

def bench_inputs(workload: Workload, model: onnx.ModelProto
                 ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The seeded inputs at batch 1 (first call, agreement, latency) and at the workload's
    batch size (throughput)."""
    feeds1 = _inputs.make(model, workload.seed, batch=1)
    feeds_b = (feeds1 if workload.batch_size == 1
               else _inputs.make(model, workload.seed, batch=workload.batch_size))
    return feeds1, feeds_b


def training_model(workload: Workload, model: onnx.ModelProto, model_path: Path
                   ) -> tuple[onnx.ModelProto | None, Path | None]:
    """The model training steps are taken on and its file (a builder's model with its loss, else
    the model itself, whose loss output is checked); (None, None) when the workload trains not."""
    if not workload.train:
        return None, None
    if workload.model.get("builder"):
        return workload.onnx_model(loss=True)
    outputs = [o.name for o in model.graph.output]
    if workload.loss_output not in outputs:  # its outputs named, and the closest
        raise ConfigError(f"{workload.path}: field 'model.loss' is '{workload.loss_output}', "
                          f"not an output of the model (its outputs: "
                          f"{listed(workload.loss_output, outputs)})")
    return model, model_path


def training_inputs(workload: Workload, train_model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The seeded inputs (and labels) of the training steps, at the workload's batch size."""
    return _inputs.make(train_model, workload.seed, batch=workload.batch_size)


def reference_outputs(model_path: Path, feeds1: dict[str, np.ndarray], say: Progress,
                      name: str) -> list[np.ndarray] | None:
    """The reference backend's outputs at batch 1 (None if it cannot run the model)."""
    from d500.backends import get
    say(f"{name}: reference outputs for agreement")
    try:
        return [np.asarray(o) for o in get("reference").prepare(str(model_path)).run(feeds1)]
    except Exception:  # noqa: BLE001 - then agreement is not measured; the note says why
        return None


def _fail(r: BackendBench, err: BaseException) -> None:
    r.status = "failed"
    r.error = describe(err)
    if isinstance(err, UnsupportedOperator):
        r.unsupported = err


def first_call(r: BackendBench, backend: type[Backend], model_path: Path,
               feeds1: dict[str, np.ndarray], *, timed: bool = True,
               say: Progress | None = None) -> list[np.ndarray] | None:
    """Cold load+translate (`r.exe`) and the first call at batch 1, timed unless told not to;
    the outputs, or None when either raised (which fails `r`)."""
    from d500 import backends
    say = say or (lambda text: None)
    say(f"{r.backend}: load and translate")
    try:
        t0 = time.perf_counter()  # the framework's import is not the model's translation
        fw = backends.framework(r.backend)
        if fw is not None:
            backends.import_quietly(fw[0])
        if timed:
            r.details["framework_import_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        r.exe = backend.prepare(str(model_path))
        if timed:
            r.figures["translate_time"] = time.perf_counter() - t0
        if settings := r.exe.settings():  # what the framework says its mode runs with
            r.details["settings"] = settings
        say(f"{r.backend}: first call")
        t0 = time.perf_counter()
        outputs = [np.asarray(o) for o in r.exe.run(feeds1)]
        if timed:
            r.figures["first_call_time"] = time.perf_counter() - t0
            if (compiled := getattr(r.exe, "compile_time", None)) is not None:
                if _hosted(r.exe):  # its host's word, not a figure d500 measured
                    r.details["compile_time_said"] = compiled
                else:
                    r.figures["compile_time"] = compiled  # its part of first_call_time
            if cache := getattr(r.exe, "compile_cache", None):  # an earlier run's compile?
                from d500.training.compiling import DETAIL
                r.details[DETAIL] = {"cache": cache}
            if baked := getattr(r.exe, "baked_inputs", None):  # values the program is made for
                r.details["baked_inputs"] = baked
    except Exception as err:  # noqa: BLE001 - recorded as this backend's failure
        _fail(r, err)
        return None
    return outputs


def _hosted(exe: Any) -> bool:
    from d500.networks.hosted import HostedExecutable
    return isinstance(exe, HostedExecutable)


def judge_agreement(r: BackendBench, outputs: list[np.ndarray],
                    reference_out: list[np.ndarray] | None, metrics: Sequence[str]
                    ) -> list[np.ndarray] | None:
    """The agreement verdict on `r`'s first-call outputs: the figure (max relative error), each
    output's comparison, and `r` failed beyond the tolerance of d500.networks.compare. The
    reference backend is its own reference; without reference outputs a note says why. The
    reference outputs compared with (None: none)."""
    if r.backend == "reference" and reference_out is None:
        reference_out = outputs
    if reference_out is None:
        if "agreement" in metrics:
            r.details["agreement_note"] = "the reference backend could not run the model"
        return None
    precision = getattr(r.exe, "precision", None)  # a bf16 mode is judged at bf16's tolerance
    comparisons = [compare(o.name, got, want, precision=precision) for o, got, want in
                   zip(r.exe.model.graph.output, outputs, reference_out)]
    r.figures["agreement"] = max((c.max_rel for c in comparisons), default=0.0)
    r.details["agreement"] = [c.as_dict() for c in comparisons]
    if not all(c.ok for c in comparisons) or len(outputs) != len(reference_out):
        bad = next((c for c in comparisons if not c.ok), None)
        r.status = "failed"
        r.error = (f"outputs disagree with the reference: {bad.output} max rel error "
                   f"{bad.max_rel:.3g} > {bad.rtol:g} ({bad.note})" if bad else
                   f"{len(outputs)} outputs instead of {len(reference_out)}")
    if not np.isfinite(r.figures["agreement"]):
        r.figures.pop("agreement")  # the ledger stores numbers; the error says what happened
    return reference_out


def inference_passes(workload: Workload, feeds1: dict[str, np.ndarray],
                     feeds_b: dict[str, np.ndarray]) -> list[tuple[str, int, dict[str, Any]]]:
    """The forward passes timed after the first call, as (figure, batch, inputs): batch 1 for
    latency (also when only throughput is measured), and batch B for throughput when B > 1."""
    passes: list[tuple[str, int, dict[str, Any]]] = []
    if "latency" in workload.metrics or "throughput" in workload.metrics:
        passes.append(("latency", 1, feeds1))
    if "throughput" in workload.metrics and workload.batch_size > 1:
        passes.append(("throughput", workload.batch_size, feeds_b))
    return passes


def run_passes(r: BackendBench, passes: list[tuple[str, int, dict[str, Any]]]) -> None:
    """Each pass called once, untimed: one that raises fails `r` as it would while timed (a
    model that runs at batch 1 but not at batch B fails there)."""
    for _, _, feeds in passes:
        if r.status != "running":
            return
        try:
            r.exe.run(feeds)
        except Exception as err:  # noqa: BLE001 - recorded as this backend's failure
            _fail(r, err)


def first_step(r: BackendBench, backend: type[Backend], train_path: Path,
               feeds: dict[str, np.ndarray], loss: str, *, timed: bool = True,
               say: Progress | None = None) -> bool:
    """Translate the training model (`r.train_exe`) and take its first training step (forward,
    loss, backward, parameter gradients), timed unless told not to. True when training steps
    can be timed on `r`; False when its backend computes no gradients (a note says so) or the
    step raised (which fails `r`)."""
    if not backend.trainable:
        r.details["train_step_note"] = f"{r.backend} is an inference-only backend"
        return False
    (say or (lambda text: None))(f"{r.backend}: translate the training model")
    try:
        t0 = time.perf_counter()
        r.train_exe = backend.prepare(str(train_path))
        if timed:
            r.details["train_translate_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        wrt = list(r.train_exe.parameter_names)  # a training step: parameter gradients
        _, grads = r.train_exe.gradients(feeds, output=loss, wrt=wrt)
        if timed:
            r.details["train_first_step_s"] = time.perf_counter() - t0
        r.details["train_gradients"] = len(grads)
    except NotImplementedError:
        r.details["train_step_note"] = f"{r.backend} computes no gradients"
        return False
    except Exception as err:  # noqa: BLE001 - a failing training step fails this backend
        _fail(r, err)
        return False
    return True


# -- the timing ------------------------------------------------------------------------------

def time_inference(alive: list[BackendBench], feeds1, feeds_b, workload: Workload,
                    budget: float, say: Progress, loads: dict[str, Any] | None = None) -> None:
    """Latency and throughput timed; `loads`, where given, gets each pass's LoadWatch record by
    figure (reproduce judges each time by the load beside it, not averaged with the others)."""
    alive = [r for r in alive if r.status == "running"]
    for figure, batch, feeds in inference_passes(workload, feeds1, feeds_b):
        running = [r for r in alive if r.status == "running"]
        watch = LoadWatch() if loads is not None else None
        timings = _interleave(running, lambda r, feeds=feeds: _timed(
            r, r.exe, "forward", feeds, trip=budget / TRIPS),
            budget, say, f"{workload.name}: {figure} at batch {batch}")
        if watch is not None:
            loads[figure] = watch.finish()
        for r in running:
            if r.backend not in timings:
                continue
            t = timings[r.backend]
            if figure == "latency":
                r.figures["latency"], r.details["latency"] = t.median, t.summary()
            else:
                r.figures["throughput"] = batch / t.median
                r.details["throughput"] = {"batch_size": batch, **t.summary()}
    if "throughput" in workload.metrics and workload.batch_size == 1:
        for r in alive:
            if "latency" in r.figures:
                r.figures["throughput"] = 1.0 / r.figures["latency"]
                r.details["throughput"] = {"batch_size": 1, "from": "latency"}


def time_training(alive: list[BackendBench], classes, train_path, train_model,
                   workload: Workload, budget: float, say: Progress,
                   loads: dict[str, Any] | None = None) -> None:
    """The training step timed (after its first step, untimed); `loads` as time_inference's."""
    feeds = training_inputs(workload, train_model)
    loss = workload.loss_output
    ready = [r for r in alive if r.status == "running" and first_step(
        r, classes[r.backend], train_path, feeds, loss,
        say=lambda text: say(f"{workload.name}: {text}"))]
    if not ready:
        return
    watch = LoadWatch() if loads is not None else None
    timings = _interleave(
        ready, lambda r: _timed(r, r.train_exe, "step", feeds, loss=loss,
                                reference=lambda: _reference_exe(train_path),
                                trip=budget / TRIPS), budget, say,
        f"{workload.name}: training step at batch {workload.batch_size}")
    if watch is not None:
        loads["train_step_time"] = watch.finish()
    for r in ready:
        if r.backend in timings:
            r.figures["train_step_time"] = timings[r.backend].median
            r.details["train_step"] = {"batch_size": workload.batch_size,
                                       "what": "forward, loss, backward, parameter gradients",
                                       **timings[r.backend].summary()}


class _TimedFailure(Exception):
    def __init__(self, backend: str, err: BaseException):
        super().__init__(backend)
        self.backend, self.err = backend, err


def _tagged(name: str, fn: Callable[[], Any]) -> Callable[[], Any]:
    def call() -> Any:
        try:
            return fn()
        except Exception as err:
            raise _TimedFailure(name, err) from err
    return call


TRIPS = 8  # a hosted backend's round trips last at least budget / TRIPS (d500.networks.hosted)


def _reference_exe(model: Path | onnx.ModelProto) -> Any:
    from d500.backends import get
    return get("reference").prepare(model if isinstance(model, onnx.ModelProto) else str(model))


def _timed(r: BackendBench, exe: Any, kind: str, feeds: dict[str, np.ndarray], *,
           loss: str | None = None, reference: Callable[[], Any] | None = None,
           trip: float = 0.0) -> Any:
    """What one timed sample of `r` runs: checked round trips of the timed call
    (d500.networks.hosted.CheckedCall), in its host for a hosted backend, else in this process
    (a built-in one pays the check alike); a hosted row's calls are checked with the reference
    after timing (`_verify`)."""
    from d500.networks.hosted import HostedExecutable, checked_local
    wrt = list(exe.parameter_names) if kind == "step" else None
    if isinstance(exe, HostedExecutable):
        reference = reference or (lambda: _reference_exe(exe.model))
        try:
            sizing = reference()  # the shifts are sized with it (CheckedCall)
        except Exception:  # noqa: BLE001 - none: `_verify` notes that nothing was checked
            sizing = None
        timed = exe.timed(kind, feeds, loss, wrt, trip, sizing)
        timed.reference = reference if sizing is None else (lambda: sizing)
    else:  # d500's own code: its calls pay the check, unverified (level 0's built-in rows),
        timed = checked_local(exe, kind, feeds, loss, wrt)  # in round trips of level 0's size
    return timed


def _verify(r: BackendBench, fn: Any, timing: Timing, what: str) -> Timing:
    """A timing of checked round trips per call; a hosted row's calls recomputed in a sample
    with the reference (`r` fails if one is wrong)."""
    from d500.operators.bench import per_inner_call
    inner = getattr(fn, "inner", None)
    if inner is None:
        return timing
    stated = {"empty_round_trip": fn.overhead, "calls_per_round_trip": inner,
              "calls_checksummed": fn.scale is not None}
    if getattr(fn, "vocab", None) is not None:  # token ids shifted mod the vocabulary
        stated["ids_shifted_mod"] = fn.vocab
    wrong = None
    if hasattr(fn, "reference"):
        try:
            wrong = fn.check(fn.reference())
        except Exception as err:  # noqa: BLE001 - the reference cannot run it: nothing checked
            fn.checked, fn.unverified = 0, describe(err)
        if fn.unverified:
            r.details.setdefault("hosted_note", f"the reference could not check: "
                                                f"{fn.unverified}")
        stated.update({"outside_host_reading": (float(np.median(fn.outside)) if fn.outside
                                                else None),
                       "calls_checked": fn.checked, "calls_told_apart": fn.power})
        if fn.scale is None:
            r.details.setdefault("hosted_note", "the model has no float input or token ids "
                                                "to shift: its calls were not checked")
    r.details.setdefault("hosted" if hasattr(fn, "reference") else "round_trips",
                         {})[what.split(": ", 1)[-1]] = stated
    if wrong:
        r.status, r.error = "failed", wrong
    return per_inner_call(timing, inner)


def _interleave(rs: list[BackendBench], make_fn, budget: float, say: Progress,
                what: str) -> dict[str, Timing]:
    """Time the backends side by side; one that raises while timed fails, the others go on.
    This process's heap is set as its hosts' are (d500.heap.allocator), so that an
    in-process row and a hosted one allocate alike."""
    from d500.heap import allocator
    allocator()
    rs = [r for r in rs if r.status == "running"]
    fns: dict[str, Any] = {}
    for r in list(rs):
        try:
            fns[r.backend] = make_fn(r)
        except Exception as err:  # noqa: BLE001 - a hosted call that cannot be sized
            _fail(r, err)
            rs.remove(r)
    timings = _interleave_fns(rs, fns, budget, say, what)
    for r in rs:
        if r.backend in timings:
            timings[r.backend] = _verify(r, fns[r.backend], timings[r.backend], what)
            if r.status != "running":
                del timings[r.backend]
    return timings


def _interleave_fns(rs: list[BackendBench], fns: dict[str, Any], budget: float,
                    say: Progress, what: str) -> dict[str, Timing]:
    while rs:
        counts: dict[str, int] = {}

        def tick(name: str, n: int, counts: dict[str, int] = counts) -> None:
            counts[name] = n
            say(f"{what}: " + ", ".join(f"{k} {v}" for k, v in counts.items()) + " samples")

        say(what)
        try:
            # Each backend's first call was made already: one more call of warm-up is enough.
            return measure_interleaved({r.backend: _tagged(r.backend, fns[r.backend])
                                        for r in rs},
                                       budget=budget, warmup=1, progress=tick)
        except _TimedFailure as failure:
            culprit = next(r for r in rs if r.backend == failure.backend)
            _fail(culprit, failure.err)
            rs = [r for r in rs if r is not culprit]
    return {}
