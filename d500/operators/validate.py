"""Validate an operator against the ONNX reference: forward and gradients on seeded inputs at
several scales (x1, x4, x16) and on edge values (0, -0, +-large, +-tiny, +-1).

The forward is compared with the reference (`ReferenceEvaluator`, in float64 on the same
dtype-rounded inputs) on every input set. Gradients are compared with central finite differences
of the reference forward (`gradcheck`): at x1 input by input (the element-wise Jacobian for small
inputs, randomized directional checks with localisation for large ones), then, once x1 passed,
one joint directional check over all inputs on each further scale and on the edge values (there
only on elements where the reference backend's own gradient is finite). A joint check that fails
is followed by per-input checks that name and locate the wrong gradient.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from d500 import tolerances
from d500.errors import describe
from d500.operators.adapters import runner
from d500.operators.base import CustomOperator
from d500.operators.checks import Check, compare
from d500.operators.dtypes import finfo, is_exact, is_float, numpy_dtype, saturate
from d500.operators.gradients import check_gradients
from d500.operators.inputs import SCALES, InputSet, edge_inputs, make_inputs, scaled_sets
from d500.operators.reference import Reference, input_names, output_names
from d500.operators.workloads import Case

__all__ = ["Check", "Options", "Prepared", "Report", "compare", "make_inputs", "prepare",
           "validate"]


@dataclass
class Report:
    """The verdict on one operator case."""

    case: str
    op_type: str
    operator: str
    framework: str
    dtype: str
    shapes: list[list[int]]
    attributes: dict[str, Any]
    checks: list[Check] = field(default_factory=list)
    gradient_dtype: str | None = None
    gradients_checked: bool = False
    seconds: float = 0.0
    error: str = ""

    @property
    def passed(self) -> bool:
        return not self.error and all(c.passed for c in self.checks)

    @property
    def forward_error(self) -> float:
        return max((c.max_rel for c in self.checks if "output" in c.kind), default=math.inf)

    @property
    def gradient_error(self) -> float | None:
        grads = [c.max_rel for c in self.checks if "gradient" in c.kind]
        return max(grads) if grads else None

    def figures(self) -> dict[str, float]:
        figures = {"forward_error": _finite(self.forward_error)}
        if self.gradient_error is not None:
            figures["gradient_error"] = _finite(self.gradient_error)
        return figures

    def summary(self) -> str:
        if self.error:
            return self.error
        bad = [c for c in self.checks if not c.passed]
        if not bad:
            return "passed"
        c = bad[0]
        return f"{c.kind} {c.name} disagrees with the reference: {c.verdict()}"

    def text(self) -> str:
        dims = ", ".join("x".join(map(str, s)) or "scalar" for s in self.shapes)
        attrs = ", ".join(f"{k}={v}" for k, v in self.attributes.items())
        what = f"{self.op_type}({dims}{'; ' + attrs if attrs else ''}) {self.dtype}"
        head = (what if self.case == what else f"{self.case}: {what}") + (
            f" -- {self.operator} [{self.framework}]")
        lines = [head, *(c.line() for c in self.checks)]
        if self.error:
            lines.append(f"  error: {self.error}")
        if not self.gradients_checked and not self.error:
            why = ("integer inputs have none" if is_exact(numpy_dtype(self.dtype))
                   else "the operator has no backward")
            lines.append(f"  gradients: not checked ({why})")
        verdict = "PASS" if self.passed else "FAIL"
        lines.append(f"  verdict: {verdict}  ({self.seconds:.2f} s)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(passed=self.passed, forward_error=self.forward_error,
                   gradient_error=self.gradient_error)
        return out


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 1e300


@dataclass
class Options:
    seed: int = 0
    directions: int = 3                 # random directions per input (and per joint check)
    elementwise_budget: float = 0.5     # s of finite differences per input for the full Jacobian
    elementwise_max: int = 256          # ... and at most this many elements
    localise_budget: float = 5.0        # s to localise a detected gradient error
    check_gradients: bool = True
    scales: tuple[float, ...] = SCALES  # input 0's grid spans [-2s, 2s) at each scale s
    edge_gradients: bool = True         # a directional check on the edge values too
    # one reference call's time for the elementwise/directional choice (None: as measured)
    reference_seconds: float | None = None


@dataclass
class Prepared:
    """A case made concrete: seeded inputs (every scale) and the reference's outputs on them."""

    case: Case
    rng: np.random.Generator
    inputs: list[np.ndarray]
    reference: Reference
    expected: list[np.ndarray]
    t_ref: float  # seconds of one reference forward
    sets: list[InputSet] = field(default_factory=list)  # x1 first, then the further scales

    @property
    def ref_dtype(self) -> np.dtype:
        return self.case.np_dtype if is_exact(self.case.np_dtype) else np.dtype(np.float64)


def _representable(outputs: list[np.ndarray], dtype: np.dtype) -> bool:
    """Every output finite and within the dtype's range (a scale where the operator overflows
    its dtype is outside its input range)."""
    limit = float(finfo(dtype).max)
    return all(np.all(np.isfinite(o)) and float(np.max(np.abs(o), initial=0.0)) <= limit
               for o in outputs if is_float(o.dtype))


def prepare(case: Case, seed: int = 0, scales: tuple[float, ...] = SCALES) -> Prepared:
    """Inputs and reference outputs of a case; a UsageError when the reference rejects it (bad
    shapes or attributes), before any operator is judged. (One BLAS thread, as in validate.)"""
    from threadpoolctl import threadpool_limits
    with threadpool_limits(limits=1, user_api="blas"), case.named():
        return _prepare(case, seed, scales)


def _prepare(case: Case, seed: int, scales: tuple[float, ...]) -> Prepared:
    from d500.operators.reference import infer_outputs
    rng = np.random.default_rng(seed)
    inputs = make_inputs(case, rng)
    infer_outputs(case.op_type, case.attributes, inputs, 1, case.opset)
    exact = is_exact(case.np_dtype)
    ref_inputs = [a if exact else a.astype(np.float64) for a in inputs]
    reference = Reference(case.op_type, case.attributes, ref_inputs, 1, case.opset)
    t0 = time.perf_counter()
    expected = reference(ref_inputs)
    t_ref = time.perf_counter() - t0
    sets = scaled_sets(case, inputs, seed, () if exact else scales)
    sets[0].expected = expected
    kept = [sets[0]]
    for extra in sets[1:]:
        out = reference([a.astype(np.float64) for a in extra.inputs])
        if _representable(out, case.np_dtype):
            extra.expected = out
            kept.append(extra)
    return Prepared(case, rng, inputs, reference, expected, t_ref, kept)


def validate(op_class: type[CustomOperator], case: Case, options: Options | None = None,
             operator_name: str | None = None, prepared: Prepared | None = None) -> Report:
    """Check one operator on one case against the reference; never raises for a wrong operator
    (the Report says what is wrong), raises UsageError for a case the reference rejects.

    NumPy's BLAS runs one thread meanwhile (restored after): nothing here is timed, and several
    BLAS threads fighting over busy cores made the big Conv case's validation 2.4x slower on a
    loaded 2-core machine (4.7 s against 2.0 s)."""
    from threadpoolctl import threadpool_limits
    with threadpool_limits(limits=1, user_api="blas"):
        return _validate(op_class, case, options or Options(), operator_name, prepared)


def _validate(op_class: type[CustomOperator], case: Case, options: Options,
              operator_name: str | None, prepared: Prepared | None) -> Report:
    start = time.perf_counter()
    report = Report(case.name, case.op_type, operator_name or op_class.__name__,
                    op_class.framework, case.dtype, [list(s) for s in case.shapes],
                    dict(case.attributes))
    prepared = prepared or prepare(case, options.seed, options.scales)
    rng, inputs = prepared.rng, prepared.inputs
    exact = is_exact(case.np_dtype)
    ref_dtype = prepared.ref_dtype
    in_names = input_names(case.op_type, len(inputs), case.opset)
    try:
        op = op_class(**case.attributes)
        run = runner(op)
        outputs = run.forward(inputs)
    except Exception as err:  # noqa: BLE001 - a crashing operator is a wrong operator
        report.error = f"forward raised {describe(err)}"
        report.seconds = time.perf_counter() - start
        return report
    if not outputs:
        report.error = "forward returned no output"
        report.seconds = time.perf_counter() - start
        return report
    reference, sets = prepared.reference, prepared.sets
    if len(outputs) > 1:  # the operator also returns optional outputs: compare those too
        reference = Reference(case.op_type, case.attributes,
                              [a.astype(ref_dtype) for a in inputs], len(outputs), case.opset)
        sets = [replace(s, expected=reference([a.astype(ref_dtype) for a in s.inputs]))
                for s in sets]
    expected = saturate(sets[0].expected, case.np_dtype)
    n_out = min(len(outputs), len(expected))
    out_names = output_names(case.op_type, n_out, case.opset)
    rtol, atol = tolerances.operator_forward(case.np_dtype)

    for k in range(n_out):
        check = compare("output", out_names[k], outputs[k], expected[k], rtol, atol)
        if outputs[k].dtype != expected[k].dtype and not exact and \
                outputs[k].dtype != case.np_dtype and is_float(expected[k].dtype):
            check.note = f"returned {outputs[k].dtype}, expected {case.dtype}"
        report.checks.append(check)
    for extra in sets[1:]:
        try:
            got = run.forward(extra.inputs)
        except Exception as err:  # noqa: BLE001
            report.error = f"forward on the {extra.label} inputs raised {describe(err)}"
            break
        for k in range(n_out):
            report.checks.append(compare(f"output {extra.label}", out_names[k], got[k],
                                         saturate(extra.expected, case.np_dtype)[k], rtol, atol))
    edged = edge_inputs(case, inputs, rng)
    edge_ref = None
    if edged is not None and not report.error:
        try:
            edge_out = run.forward(edged)
            edge_ref = reference([a.astype(ref_dtype) for a in edged])
            held = saturate(edge_ref, case.np_dtype)
            for k in range(n_out):
                report.checks.append(compare("edge output", out_names[k], edge_out[k],
                                             held[k], rtol, atol))
        except Exception as err:  # noqa: BLE001
            report.error = (f"forward on edge values (0, -0, +-large, +-tiny) raised "
                            f"{describe(err)}")

    if options.check_gradients and not exact and run.has_gradients and not report.error:
        edge = None if edge_ref is None else InputSet("edge", edged, sets[0].kinks,
                                                      sets[0].poles, edge_ref[:n_out])
        t_ref = (options.reference_seconds if options.reference_seconds is not None
                 else prepared.t_ref)
        check_gradients(run, case, sets, edge, in_names, outputs[:n_out], reference,
                        t_ref, report, options, rng)
    report.seconds = time.perf_counter() - start
    return report

