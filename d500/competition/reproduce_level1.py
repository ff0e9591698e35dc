"""Level 1 in `d500 reproduce`: a packaged `d500 net check` or `net bench` run (one backend's
outputs against the reference on one model) run again on the same model, inputs, backend and
thread count, and a packaged `d500 conformance` run's node tests run again; what must not depend
on the machine is compared: the status (the verdict), the agreement figure up to rounding, the
node-test counts and the failing tests' names. A bench run is timed again only where this
machine's hardware key is the run's, and its times are then compared by d500.competition.reproduce
(reproduce_time.latency_checks); elsewhere its steps run once, untimed.

The model is found by the sha256 the run recorded (d500.competition.reproduce_model). A run
whose model is found nowhere, whose inputs came from an `--inputs` file (the ledger keeps only
their shapes) or whose baseline was the majority of the backends checked beside it is reported
as not reproducible, with the reason.

The agreement figure (max|a - b| / max|b| against the reference) is rounding, which another
machine's kernels reassociate. Measured here at batch 1 (light SqueezeNet, ResNet-50 and
DenseNet-121 with seeded random weights, ResNet-20): one backend at 1 and at 2 threads gave
figures up to 2.2x apart (torch on ResNet-50 5.0e-7 and 1.1e-6, TensorFlow on DenseNet-121 3.8e-7
and 7.2e-7), and another framework's kernels for the same arithmetic 7.5x (torch 5.0e-7,
onnxruntime 3.0e-6 on ResNet-50). So two figures agree within FACTOR (10) of each other; and
below FLOOR_EPS (8) units of the output dtype's precision (9.5e-7 for float32) a figure is noise
whose ratio means nothing (identical kernels give 0), so any two such figures agree. The verdict
(within the tolerance the run used: its `--rtol`, or each output dtype's default) is the status.

A conformance run's suite is onnx's own: another onnx version builds other tests with other
expected outputs, so it is compared only under the recorded onnx version.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from d500.competition.reproduce_compare import Check, error_note, show
from d500.competition.reproduce_model import resolve_model
from d500.competition.reproduce_prepare import (
    Prepared,
    Unreproducible,
    check_files,
    origin_threads,
    rulebook_file,
)
from d500.errors import D500Error

FACTOR = 10.0
FLOOR_EPS = 8
TIMEOUT = 900.0  # seconds for one network (or a selection of node tests)
SUITE_TIMEOUT = 3600.0  # the whole node suite
COUNTS = ("node_tests_passed", "node_tests_failed", "node_tests_unsupported", "node_tests_total")
TEST_LISTS = {"failed tests": "failed_tests", "unsupported tests": "unsupported_tests"}


def kind(run: Any) -> str:
    """What made a level-1 run: "conformance", "bench" (a workload file) or "check"."""
    from d500 import conformance_runs
    name = run.workload or ""
    if run.submission == conformance_runs.SUBMISSION and name.split(":")[0] == \
            conformance_runs.WORKLOAD:
        return "conformance"
    if run.row.get("workload_text") is not None:
        return "bench"
    if name.startswith("check:"):
        return "check"
    raise Unreproducible(f"level-1 run of workload '{name}' is none of net check, net bench or "
                         "conformance")


# -- before anything runs (the parent process) ------------------------------------------------

def prepare(pkg: Any, run: Any, rules_dir: Path, folder: Path) -> Prepared:
    """A level-1 run ready to re-run, or Unreproducible saying why it cannot be."""
    check_files(pkg, run, folder)
    what = kind(run)
    if what == "conformance":
        return _suite(run, folder)
    workload = path = None
    if what == "bench":
        from d500.networks import workloads
        path = rulebook_file(pkg, run, rules_dir)
        workload = workloads.load(path)
    model, found = resolve_model(pkg, run, rules_dir, folder, workload)
    baseline = run.details.get("baseline") or run.hyperparameters.get("baseline") or "reference"
    if what == "check" and run.details.get("baseline_kind") == "majority":
        raise Unreproducible(f"its baseline was {baseline}, the backend most of the backends "
                             "checked beside it agreed with; re-run `d500 net check` with them")
    settings = {"kind": what, "model": str(model), "found": found,
                **_inputs(model, run, workload), "rtol": _rtol(run),
                "hyperparameters": run.hyperparameters, "timed": what == "bench" and _here(run)}
    if run.environment and (run.environment.get("threads") or {}).get("count"):
        threads, why = origin_threads(run.environment, run.backend, None)
    else:
        threads, why = None, ("not set: the frameworks' defaults, as the origin had (`d500 net "
                              "check` sets no count)")
    return Prepared(run, workload, path, folder, settings, threads, why, TIMEOUT)


def _here(run: Any) -> bool:
    """Whether this machine's hardware key is the run's (its times can be compared here)."""
    from d500.leaderboard.environments import machine
    from d500.provenance import collect
    theirs = machine(run.environment)
    return bool(theirs) and theirs == machine(collect())


def _suite(run: Any, folder: Path) -> Prepared:
    """A conformance run: comparable only under the onnx version that built its tests."""
    import onnx
    hyper = run.hyperparameters
    recorded = hyper.get("onnx_version") or run.details.get("onnx_version")
    if recorded != onnx.__version__:
        raise Unreproducible(f"its node tests were onnx {recorded}'s and this machine has onnx "
                             f"{onnx.__version__}: another version builds other tests with other "
                             "expected outputs, so the counts cannot be compared")
    ops = hyper.get("ops")
    settings = {"kind": "conformance", "ops": ops, "device": hyper.get("device") or "CPU"}
    return Prepared(run, None, None, folder, settings, None,
                    "not set: the frameworks' defaults, as `d500 conformance` has",
                    TIMEOUT if ops else SUITE_TIMEOUT)


def _inputs(model_path: Path, run: Any, workload: Any) -> dict[str, Any]:
    """How the run's inputs are made again (seed, batch, named dimensions), checked to give the
    shapes it recorded."""
    from d500.model import load
    from d500.networks import inputs
    recorded = run.details.get("inputs") or {}
    try:
        specs = inputs.specs(load(model_path))
        if workload is not None:  # net bench: agreement at batch 1 on the workload's seed
            made = {"seed": workload.seed, "batch": 1, "dims": {}}
        elif run.seed is None:
            raise Unreproducible("its inputs came from an --inputs file, of which the ledger "
                                 "keeps only the shapes")
        else:
            dims = {d: recorded[s.name][axis] for s in specs for axis, d in enumerate(s.shape)
                    if isinstance(d, str) and axis < len(recorded.get(s.name) or [])}
            made = {"seed": run.seed, "batch": None, "dims": dims}
        shapes = {k: list(v) for k, v in inputs.resolve_shapes(
            specs, batch=made["batch"], dims=made["dims"]).items()}
    except Unreproducible:
        raise
    except D500Error as err:
        raise Unreproducible(f"its inputs cannot be made again ({err})") from None
    if shapes != recorded:
        raise Unreproducible(f"its recorded input shapes {_shapes(recorded)} are not those its "
                             f"model and seed give ({_shapes(shapes)})")
    return made


def _rtol(run: Any) -> float | None:
    """The tolerance the check ran with (`--rtol`, or each output dtype's default): one value
    over the float outputs, else None (each output's default)."""
    recorded = run.details.get("comparisons") or run.details.get("agreement") or []
    floats = {c.get("rtol") for c in recorded if isinstance(c, dict) and c.get("rtol")}
    return floats.pop() if len(floats) == 1 else None


def _shapes(shapes: dict[str, Any]) -> str:
    """Input shapes in one line: `x 1x3x32x32, mask scalar`."""
    return ", ".join(f"{k} {'x'.join(map(str, v)) or 'scalar'}" for k, v in shapes.items())


# -- the reproduction (its own process: d500.competition.reproduce_job) -----------------------

def run(job: dict[str, Any], ledger: Any) -> dict[str, Any]:
    """Re-run the job's level-1 run into `ledger`; the result as reproduce_job reports it."""
    from d500 import backends, threads
    from d500.networks import hosted
    settings = job["params"]
    if settings["kind"] in ("bench", "check"):  # as net bench and net check run it
        backends.host_plugins()  # a third-party backend in a host (d500.networks.hosted)
    if job["threads"] is not None:
        threads.configure(int(job["threads"]), threads.frameworks([job["backend"],
                                                                   "reference"]))
    if settings["kind"] == "conformance":
        return _conformance(job, ledger)
    try:
        return _bench(job, ledger) if settings["kind"] == "bench" else _check(job, ledger)
    finally:
        hosted.close_all()


def _sealed(ledger: Any, run_id: int, extra: dict[str, Any]) -> dict[str, Any]:
    """The sealed reproduction's status, figures, error and thread count, with `extra`."""
    from d500 import threads
    row = ledger.get(run_id)
    return {"run_id": run_id, "status": row["status"], "figures": row["figures"],
            "error": row["error"] or "", "threads": threads.actual(), **extra}


def floor(outputs: list[Any]) -> float:
    """FLOOR_EPS units of the precision of the outputs' float dtypes (0: none is a float)."""
    import numpy as np
    eps = [float(np.finfo(o.dtype).eps) for o in outputs
           if np.issubdtype(o.dtype, np.inexact)]
    return FLOOR_EPS * max(eps, default=0.0)


def _check(job: dict[str, Any], ledger: Any) -> dict[str, Any]:
    """`d500 net check` of the model on the backend (the reference as baseline), recorded as
    net check records it."""
    from d500.model import load
    from d500.networks import inputs
    from d500.networks.check import Recorder, check
    s, backend = job["params"], job["backend"]
    model = load(s["model"])
    feeds = inputs.make(model, s["seed"], batch=s["batch"], dims=s["dims"])
    recorder = Recorder(Path(s["model"]), ledger, workload=job["case"])
    report = check(model, feeds, [backend], model_name=s["model"], seed=s["seed"],
                   rtol=s["rtol"], recorder=recorder)
    base = next((r for r in report.results if r.backend == report.baseline), None)
    if backend not in recorder.sealed:  # nothing to compare it with (the reference failed)
        return {"run_id": None, "status": "failed", "error": report.note}
    return _sealed(ledger, recorder.sealed[backend], {
        "floor": floor(base.outputs if base is not None and base.outputs else []),
        "model_found": s["found"]})


def _bench(job: dict[str, Any], ledger: Any) -> dict[str, Any]:
    """What `d500 net bench` can fail a backend by, in its order and with its code
    (d500.networks.bench), untimed: the model translated and run at batch 1 and judged against
    the reference's outputs, each forward pass it times (batch 1, batch B) called once, and the
    first training step where it times them; recorded with the status, figures and error bench
    gives."""
    from d500.errors import describe
    from d500.model import load
    from d500.networks import bench, hosted, workloads
    s, backend = job["params"], job["backend"]
    wl = workloads.load(job["workload"])
    path = Path(s["model"])
    model = load(path)
    feeds1, feeds_b = bench.bench_inputs(wl, model)
    run = ledger.start_run(level=1, workload=wl.name, submission=backend, backend=backend,
                           seed=wl.seed, hyperparameters=s["hyperparameters"],
                           workload_file=wl.path, model_file=s["model"])
    timed = bool(s.get("timed"))  # on the run's own hardware: its times measured again
    r = bench.BackendBench(backend, run=run, run_id=run.id, details={
        "reproduced": "status, agreement and times" if timed else
        "status and agreement; times are not measured (another machine)",
        "inputs": {k: list(v.shape) for k, v in feeds1.items()}})
    compared = None
    try:
        train_model, train_path = bench.training_model(wl, model, path)
        cls = hosted.backend(backend)
        reference = None
        if "agreement" in wl.metrics and backend != "reference":
            reference = bench.reference_outputs(path, feeds1, lambda text: None, wl.name)
        outputs = bench.first_call(r, cls, path, feeds1, timed=False)
        if outputs is not None:
            compared = bench.judge_agreement(r, outputs, reference, wl.metrics)
        bench.run_passes(r, bench.inference_passes(wl, feeds1, feeds_b))
        if wl.train and r.status == "running":
            feeds = bench.training_inputs(wl, train_model)
            bench.first_step(r, cls, train_path, feeds, wl.loss_output, timed=False)
        if timed and r.status == "running":  # then timed as `d500 net bench` times them,
            from d500.provenance import LoadWatch  # with the load beside each pass and all
            budget, loads = s["hyperparameters"].get("budget") or wl.budget, {}
            watch = LoadWatch()  # (d500.competition.reproduce._load)
            bench.time_inference([r], feeds1, feeds_b, wl, budget, lambda text: None, loads)
            if wl.train:
                bench.time_training([r], {backend: cls}, train_path, train_model, wl, budget,
                                    lambda text: None, loads)
            r.details["load_average"], r.details["load_by_pass"] = watch.finish(), loads
    except BaseException as err:
        run.finish("interrupted" if isinstance(err, KeyboardInterrupt) else "failed",
                   figures=r.figures, details=r.details, error=describe(err))
        raise
    run.finish("succeeded" if r.status == "running" else r.status, figures=r.figures,
               details=r.details, error=r.error or None)
    return _sealed(ledger, run.id, {"floor": floor(compared or []), "model_found": s["found"]})


def _conformance(job: dict[str, Any], ledger: Any) -> dict[str, Any]:
    """The node tests of the recorded operators (or every one) on the backend, recorded as
    `d500 conformance` records them."""
    from d500.conformance_runs import record
    s = job["params"]
    _, run_id = record(job["backend"], s["ops"], ledger=ledger, progress=False,
                       device=s["device"])
    details = ledger.get(run_id)["details"]
    return _sealed(ledger, run_id, {key: details.get(key) for key in TEST_LISTS.values()})


# -- the comparison ---------------------------------------------------------------------------

def close(a: float | None, b: float | None, low: float) -> bool:
    """Two agreement figures within FACTOR of each other, or both at most `low`."""
    if a is None or b is None:
        return a is b
    if not (math.isfinite(a) and math.isfinite(b)):
        return a == b
    hi, lo = max(abs(a), abs(b)), min(abs(a), abs(b))
    return hi <= low or hi <= FACTOR * lo


def checks(origin: Any, result: dict[str, Any]) -> list[Check]:
    """The reproduction's status and figures against the origin's."""
    status = result.get("status")
    out = [Check("status", origin.status, status, "equal", origin.status == status,
                 error_note((origin.error, result.get("error") or None)))]
    if kind(origin) == "conformance":
        return out + _suite_checks(origin, result)
    a, b = origin.figures.get("agreement"), (result.get("figures") or {}).get("agreement")
    if a is None and b is None:
        return out
    low = float(result.get("floor") or 0.0)
    out.append(Check("agreement", a, b, f"within {FACTOR:g}x of each other, or both at most "
                     f"{low:.2g} ({FLOOR_EPS} units of the output's precision)",
                     close(a, b, low), f"the model: {result.get('model_found')}"))
    return out


def _suite_checks(origin: Any, result: dict[str, Any]) -> list[Check]:
    """A conformance run's node-test counts (equal) and failing tests (the same, by name)."""
    figures = result.get("figures") or {}
    out = [Check(name, origin.figures.get(name), figures.get(name), "equal",
                 origin.figures.get(name) == figures.get(name))
           for name in COUNTS if name in origin.figures or name in figures]
    for label, key in TEST_LISTS.items():
        a, b = set(origin.details.get(key) or []), set(result.get(key) or [])
        note = "; ".join(f"only {who}: {', '.join(sorted(names))}" for who, names in
                         (("recorded", a - b), ("reproduced", b - a)) if names)
        out.append(Check(label, len(a), len(b), "the same tests, by name", a == b, note))
    return out


def summary(checks: list[Check]) -> str:
    """The compared figures in one table cell: `agreement R -> P` or the node-test counts."""
    by = {c.name: c for c in checks}

    def pair(c: Check) -> str:
        same = c.recorded == c.reproduced
        return show(c.recorded) if same else f"{show(c.recorded)} -> {show(c.reproduced)}"
    if "agreement" in by:
        return f"agreement {pair(by['agreement'])}"
    counts = [f"{name.split('_')[-1]} {pair(by[name])}" for name in COUNTS[:3] if name in by]
    return ", ".join(counts) or "-"
