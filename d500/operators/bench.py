"""Benchmark an operator beside each backend's own implementation of the same ONNX operator:
the forward and the backward timed as separate figures (`latency`, `backward_latency`).

Every implementation is first checked against the reference (the operator fully, a backend on
its forward); one that fails is reported failed and never timed or ranked. The others are timed
side by side (d500.timing.measure_interleaved), each forward and each backward a separate
callable: warm-up, then samples until the 95% CI of the median is within 5% or the time budget
ends. A backward is timed alone, from the forward's saved state (`backward`): the operator's own
backward (or torch autograd / a tf.GradientTape over its forward), each backend's own gradient.
Every forward, the operator's and each backend's, is timed as the same checked calls
(d500.operators.host.checked_forward: each call on its own shifted input, its outputs
checksummed), and every backward alike (checked_backward: each call on its own shifted output
gradient, its input gradients checksummed; a backend's through `HookRunner`), so that every row
of a comparison pays the check alike. The operator's calls are then recomputed in a sample with
the reference (`_verify_calls`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import numpy as np

from d500 import progress, tolerances
from d500.errors import D500Error, describe
from d500.operators import flops
from d500.operators.adapters import Runner, runner
from d500.operators.backward import FORWARD_AND_BACKWARD, BackwardCall, builtin_backward
from d500.operators.base import CustomOperator
from d500.operators.dtypes import is_float, saturate
from d500.operators.host import checked_backward, checked_forward
from d500.operators.reference import infer_outputs, typed_node_model
from d500.operators.validate import Options, Report, compare, prepare, validate
from d500.operators.workloads import Case

BUILTIN = "builtin"  # the submission name of a backend's own implementation


@dataclass
class Row:
    """One implementation of one case: its check, its timings and its figures."""

    submission: str
    backend: str
    status: str                      # "ok" | "failed"
    figures: dict[str, float] = field(default_factory=dict)
    timing: dict[str, Any] | None = None           # the forward
    backward_timing: dict[str, Any] | None = None  # the backward alone
    backward_note: str = ""          # why there is no backward figure, or how it was taken
    error: str = ""
    validation: dict[str, Any] | None = None
    run_id: int | None = None

    def line(self) -> str:
        label = f"{self.submission} [{self.backend}]"
        if self.status != "ok" or not self.timing:
            return f"  {label:<34} FAILED: {self.error}"
        gf = self.figures.get("gflops")
        pk = self.figures.get("peak_fraction")
        extra = (f"  {gf:8.3g} GFLOP/s" if gf is not None else "") + (
            f"  {pk:6.3g}% of peak" if pk is not None else "")
        lines = [f"  {label:<34} forward  {_stats(self.timing)}{extra}"]
        if self.backward_timing:
            lines.append(f"  {'':<34} backward {_stats(self.backward_timing)}")
        elif self.backward_note:
            lines.append(f"  {'':<34} backward: {self.backward_note}")
        return "\n".join(lines)


def _stats(t: dict[str, Any]) -> str:
    ci = t["ci95"]
    conv = "" if t["target_met"] else "  (budget ended before the CI reached 5%)"
    return (f"median {_ms(t['median'])}  IQR {_ms(t['iqr'])}"
            f"  95% CI [{_ms(ci[0])}, {_ms(ci[1])}]  n={t['repetitions']}x{t['number']}{conv}")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.4f} ms"


@dataclass
class CaseResult:
    case: Case
    report: Report
    rows: list[Row]
    flops: float | None

    @property
    def operator_failed(self) -> bool:
        """Failed validation, or its timed calls' check (the operator's row, rows[0])."""
        return not self.report.passed or self.rows[0].status != "ok"

    def text(self) -> str:
        head = f"{self.case.name}: {self.case.op_type} {self.case.dtype}" + (
            f", {self.flops / 1e9:.4g} GFLOP per call" if self.flops else "")
        return "\n".join([head, *(r.line() for r in self.rows)])

    def to_dict(self) -> dict[str, Any]:
        return {"case": self.case.name, "op_type": self.case.op_type, "dtype": self.case.dtype,
                "flops": self.flops, "rows": [asdict(r) for r in self.rows]}


def output_gradients(case: Case, inputs: list[np.ndarray], seed: int
                     ) -> list[np.ndarray | None]:
    """Seeded output gradients for the timed backward (None for non-float outputs)."""
    rng = np.random.default_rng([seed, 0xBAC])
    outs = infer_outputs(case.op_type, case.attributes, inputs, 1, case.opset)
    return [np.array(rng.standard_normal(shape), dtype=dtype, order="C")
            if is_float(dtype) else None for dtype, shape in outs]


def bench(op_class: type[CustomOperator], case: Case, backends: list[str],
          submission: str, options: Options | None = None, budget: float | None = None,
          peak: float | None = None) -> CaseResult:
    """Validate, then time the operator and every backend's implementation on one case, the
    forward and the backward separately. This process's heap is set as the operator host's
    (d500.heap.allocator), so that a hosted row and an in-process one allocate alike."""
    from d500.heap import allocator
    allocator()
    options = options or Options()
    prepared = prepare(case, options.seed, options.scales)
    inputs = [a.copy() for a in prepared.inputs]
    expected = saturate(prepared.expected, case.np_dtype)[0]
    progress.step(f"{case.name}: validating {submission}")
    report = validate(op_class, case, options, submission, prepared)
    outs = infer_outputs(case.op_type, case.attributes, inputs, 1, case.opset)
    n_flops = flops.count(case.op_type, case.attributes, [a.shape for a in inputs],
                          [shape for _, shape in outs])
    grads = output_gradients(case, inputs, options.seed)
    rows: list[Row] = []
    forward: dict[int, Callable[[], Any]] = {}
    backward: dict[int, BackwardCall] = {}
    mine = Row(submission, op_class.framework, "ok" if report.passed else "failed",
               dict(report.figures()), error="" if report.passed else report.summary(),
               validation=report.to_dict())
    rows.append(mine)
    if report.passed:
        run = runner(op_class(**case.attributes))
        forward[0] = checked_forward(run, inputs, _reference(prepared, case),
                                     tolerances.operator_forward(case.np_dtype))
        _add_backward(backward, mine, 0, partial(_operator_backward, run, inputs, grads,
                                                 _gradient_reference(case),
                                                 _gradient_tolerance(case)))
    rtol, atol = tolerances.operator_forward(case.np_dtype)
    for name in backends:
        progress.step(f"{case.name}: preparing {name}")
        row, call, exe = _backend(name, case, inputs, expected, rtol, atol)
        rows.append(row)
        if call is not None:
            k = len(rows) - 1
            forward[k] = call
            _add_backward(backward, row, k,
                          partial(_builtin_backward, name, exe, case, inputs, grads))
    if forward:
        budget = budget if budget is not None else case.time_budget
        progress.step(f"{case.name}: timing {len(forward)} implementation(s) interleaved, "
                      f"{budget:g} s each")
        _time(rows, forward, backward, budget, n_flops, peak)
        if 0 in forward:
            progress.step(f"{case.name}: recomputing sampled calls with the reference")
            _verify_calls(mine, forward[0], backward.get(0), prepared, case)
    return CaseResult(case, report, rows, n_flops)


def _verify_calls(row: Row, timed: Any, backward: BackwardCall | None, prepared: Any,
                  case: Case) -> None:
    """Fail the operator's row when its timed forward or backward calls, recomputed in a sample
    with the reference, were not all run (d500.operators.host.Batched.verify)."""
    if not hasattr(timed, "verify"):
        return
    problem = timed.verify(_reference(prepared, case),
                           *tolerances.operator_forward(case.np_dtype))
    if row.timing is not None:
        row.timing["calls_checked"] = timed.checked
        row.timing["calls_told_apart"] = timed.power
        if timed.unverified:
            row.timing["calls_unverified"] = timed.unverified
    if not problem and backward is not None and hasattr(backward.call, "verify"):
        problem = backward.call.verify(_gradient_reference(case), *_gradient_tolerance(case))
        if row.backward_timing is not None:
            row.backward_timing["calls_checked"] = backward.call.checked
            row.backward_timing["calls_told_apart"] = backward.call.power
            if backward.call.unverified:
                row.backward_timing["calls_unverified"] = backward.call.unverified
    if problem:
        row.status, row.error = "failed", problem
        row.figures.pop("latency", None)
        row.figures.pop("gflops", None)
        row.figures.pop("peak_fraction", None)
        row.timing = row.backward_timing = None
        row.figures.pop("backward_latency", None)


def _reference(prepared: Any, case: Case) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    """The reference's forward on inputs of the case's dtype, as the operator's are judged."""
    from d500.operators.dtypes import is_exact
    exact = is_exact(case.np_dtype)

    def reference(arrays: list[np.ndarray]) -> list[np.ndarray]:
        wide = [a if exact else a.astype(np.float64) for a in arrays]
        return saturate(prepared.reference(wide), case.np_dtype)
    return reference


def _gradient_reference(case: Case) -> Callable[..., list[np.ndarray]]:
    """The reference's gradients of the float inputs (float64; zeros where it gives none)."""
    from d500.operators.reference import reference_gradients

    def reference(inputs: list[np.ndarray], grads: list[np.ndarray | None]
                  ) -> list[np.ndarray]:
        wide = [a.astype(np.float64) if is_float(a.dtype) else a for a in inputs]
        seeds = [None if g is None else np.asarray(g).astype(np.float64) for g in grads]
        got = reference_gradients(case.op_type, case.attributes, wide, seeds, case.opset)
        return [np.zeros(a.shape) if g is None else np.asarray(g)
                for g, a in zip(got, inputs) if is_float(a.dtype)]
    return reference


def _gradient_tolerance(case: Case) -> tuple[float, float]:
    """(rtol, atol_frac) of a checked backward call's input gradients, element by element: the
    directional derivative's tolerance, and a hundredth of it of the peak (as much made Log's
    gradient, 1/x, peaked, a blind check: its pairs of calls told apart 0.05 at most)."""
    tol = tolerances.operator_gradient(case.np_dtype)
    return tol, tol / 100


def _operator_backward(run: Any, inputs: list[np.ndarray], grads: list[np.ndarray | None],
                       reference: Any, tolerance: tuple[float, float]) -> BackwardCall | None:
    if not run.has_gradients or all(g is None for g in grads):
        return None
    call = checked_backward(run, inputs, grads, reference, tolerance)
    return None if call is None else BackwardCall(call, method="the operator's backward")


def _builtin_backward(name: str, exe: Any, case: Case, inputs: list[np.ndarray],
                      grads: list[np.ndarray | None]) -> BackwardCall | None:
    """A backend's own backward timed through the same checked calls as the operator's
    (`HookRunner`), so that its row pays the check alike."""
    buffers = [None if g is None else np.array(g, copy=True, order="C") for g in grads]
    made = builtin_backward(name, exe, case, inputs, buffers)
    if made is None:
        return None
    call = checked_backward(HookRunner(made.call, buffers), inputs, buffers)
    return None if call is None else BackwardCall(call, made.includes, made.method)


def _add_backward(backward: dict[int, BackwardCall], row: Row, k: int,
                  make: Callable[[], BackwardCall | None]) -> None:
    """Prepare row k's backward call (and run it once: a backward that raises is noted, not
    timed; the forward's figures stand)."""
    try:
        call = make()
        if call is None:
            row.backward_note = "none (no backward, or no float input/output)"
            return
        call.call()
    except Exception as err:  # noqa: BLE001 - a backend or operator failing its backward
        row.backward_note = f"not timed: the backward raised {describe(err)}"
        return
    backward[k] = call


def _time(rows: list[Row], forward: dict[int, Callable[[], Any]],
          backward: dict[int, BackwardCall], budget: float, n_flops: float | None,
          peak: float | None) -> None:
    """Time every forward and backward interleaved (the budget is per implementation, shared
    by its forward and backward) and fill in the rows' timings and figures."""
    from d500.timing import measure_interleaved
    calls = {f"f{k}": fn for k, fn in forward.items()}
    calls.update({f"b{k}": b.call for k, b in backward.items()})
    per_call = budget * len(forward) / len(calls)
    # every sample as long as an operator host's round trip, so that in-process callables and
    # the host's are timed alike (on a busy machine a short sample is preempted less often)
    from d500.operators.host import ROUND_TRIP
    long = any(getattr(fn, "inner", 1) > 1 for fn in calls.values())
    measured = measure_interleaved(calls, budget=per_call,
                                   **({"min_sample": ROUND_TRIP} if long else {}))
    timings = {name: per_inner_call(t, getattr(calls[name], "inner", 1))
               for name, t in measured.items()}
    for k in forward:
        row, timing = rows[k], timings[f"f{k}"]
        row.timing = {**timing.summary(), **_round_trips(forward[k])}
        row.figures["latency"] = timing.median
        if n_flops:
            row.figures["gflops"] = n_flops / timing.median / 1e9
            if peak:
                row.figures["peak_fraction"] = 100.0 * n_flops / timing.median / peak
    for k, b in backward.items():
        row, timing = rows[k], timings[f"b{k}"]
        summary = {**timing.summary(), "includes": b.includes, "method": b.method,
                   **_round_trips(b.call)}
        median = timing.median
        if b.includes == FORWARD_AND_BACKWARD:
            median = timing.median - timings[f"f{k}"].median
            summary["backward_median"] = median
        row.backward_note = b.method
        if median <= 0:
            row.backward_note += ": no measurable difference to the forward"
            continue
        row.backward_timing = summary
        row.figures["backward_latency"] = median


def _round_trips(fn: Any) -> dict[str, Any]:
    """What a forward's round trips were, as the judge measured them (stated, never
    subtracted): the slowest empty round trip, the calls in each, whether each call was
    shifted and checksummed, and (set by `_verify_calls`) how many the judge recomputed."""
    if not hasattr(fn, "overhead"):
        return {}
    return {"empty_round_trip": fn.overhead, "calls_per_round_trip": fn.inner,
            "calls_checksummed": getattr(fn, "scale", None) is not None, "calls_checked": 0}


def per_inner_call(timing: Any, inner: int) -> Any:
    """A Timing of calls that each ran the timed work `inner` times (an operator host's round
    trips, d500.operators.host), per run of the work."""
    if inner == 1:
        return timing
    import dataclasses
    return dataclasses.replace(
        timing, samples=[s / inner for s in timing.samples], number=timing.number * inner,
        first_call=None if timing.first_call is None else timing.first_call / inner)


def _backend(name: str, case: Case, inputs: list[np.ndarray], expected: np.ndarray,
             rtol: float, atol: float) -> tuple[Row, Callable[[], Any] | None, Any]:
    from d500 import backends
    row = Row(BUILTIN, name, "failed")
    try:
        exe = backends.get(name).prepare(typed_node_model(case.op_type, case.attributes,
                                                          inputs, 1, case.opset))
        got = exe.run(inputs)[0]
    except D500Error as err:
        row.error = _first_line(str(err))
        return row, None, None
    except Exception as err:  # noqa: BLE001 - a backend crashing on a case is a failed entry
        row.error = _first_line(f"{type(err).__name__}: {err}")
        return row, None, None
    check = compare("output", "Y", got, expected, rtol, atol)
    row.figures["forward_error"] = check.max_rel if math.isfinite(check.max_rel) else 1e300
    if not check.passed:
        row.error = (f"forward disagrees with the reference (max rel error {check.max_rel:.2e}, "
                     f"{check.mismatches} mismatches)")
        return row, None, None
    try:
        timed = checked_forward(ExecutableRunner(exe), inputs)
    except Exception as err:  # noqa: BLE001 - as above, when its timed calls crash
        row.error = _first_line(f"{type(err).__name__}: {err}")
        return row, None, None
    row.status = "ok"
    return row, timed, exe


class ExecutableRunner(Runner):
    """A backend's executable of one node as a Runner (NumPy in and out), so that its forward
    is timed through the same checked calls as an operator's (d500.operators.host)."""

    def __init__(self, exe: Any):
        self.exe, self.own_backward = exe, False

    def call(self, native: Any) -> Any:
        return self.exe.run(native)


class HookRunner(Runner):
    """A backend's own backward (d500.operators.backward) as a Runner for checked timing: before
    each call the output gradient is rewritten in place in the array the backend was given
    (the reference and torch's float tensors read it there; JAX and TensorFlow converted it
    once and pay the same add without seeing it), and the call's results are checksummed
    through NumPy. Not verified: a built-in row pays the check, as its forward does."""

    def __init__(self, call: Callable[[], Any], grads: list[np.ndarray | None]):
        self.hook, self.buffers, self.own_backward = call, grads, False

    def shifted_backward(self, arrays: Any, grad_outputs: Any) -> Callable[[np.ndarray], Any]:
        from d500.operators.adapters import Buffers, add_tiled, first_grad, signed
        k = first_grad(self.buffers)
        assert k is not None  # builtin_backward gave a call: some output has a gradient
        flat = self.buffers[k].reshape(-1)
        first, buffers = flat.copy(), Buffers()

        def backward(offsets: np.ndarray, signs: np.ndarray | None = None) -> list[np.ndarray]:
            add_tiled(first, signed(offsets, signs, buffers), flat)
            return _leaves(self.hook())
        return backward


def _leaves(value: Any) -> list[np.ndarray]:
    """The arrays in a backend's result (tensors, nested in tuples, lists and dicts), as NumPy."""
    if value is None:
        return []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in _leaves(v)]
    try:
        return [np.asarray(value)]
    except (TypeError, RuntimeError):  # a bfloat16 torch tensor
        return [np.asarray(value.float())]


def _first_line(text: str, limit: int = 300) -> str:
    line = (text.strip().splitlines() or [""])[0]
    return line if len(line) <= limit else line[:limit - 3] + "..."
