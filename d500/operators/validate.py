"""Validate an operator against the ONNX reference: forward on seeded random inputs and edge values,
gradients by randomized directional checks (element-wise Jacobian for small inputs and to localise).

Gradients are compared with central finite differences of the reference forward in float64, of
L(x) = sum_k <output_k(x), g_k> for random output gradients g. A directional check compares
<backward(g)_i, v> with (L(x + h v) - L(x - h v)) / 2h for random v, so its cost grows with the
number of directions, not with the number of input elements.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from d500 import tolerances
from d500.errors import describe
from d500.operators.adapters import Runner, runner
from d500.operators.base import CustomOperator
from d500.operators.reference import Reference, input_names, output_names
from d500.operators.workloads import Case

EDGE_LARGE = {"float16": 1e2, "float32": 1e4, "float64": 1e4}


@dataclass
class Check:
    """One compared tensor: an output (forward) or an input's gradient."""

    kind: str            # "output" | "edge output" | "gradient"
    name: str
    method: str          # "elementwise" | "directional xN" | "exact"
    passed: bool
    max_abs: float = 0.0
    max_rel: float = 0.0  # max |error| / scale (scale: max |reference|, or the derivative's RMS)
    mismatches: int = 0
    checked: int = 0
    first: list[list[int]] = field(default_factory=list)
    note: str = ""

    def line(self) -> str:
        status = "ok" if self.passed else "FAIL"
        where = f"  first at {', '.join(map(str, map(tuple, self.first)))}" if self.first else ""
        note = f"  ({self.note})" if self.note else ""
        at_least = ">=" if self.method.startswith("directional") and self.mismatches else ""
        return (f"  {self.kind:<11} {self.name:<6} {self.method:<15} max abs {self.max_abs:9.2e}"
                f"  max rel {self.max_rel:9.2e}"
                f"  mismatches {at_least}{self.mismatches}/{self.checked}"
                f"  {status}{where}{note}")


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
        grads = [c.max_rel for c in self.checks if c.kind == "gradient"]
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
        at = f" (first at {tuple(c.first[0])})" if c.first else ""
        return (f"{c.kind} {c.name} disagrees with the reference: max rel error "
                f"{c.max_rel:.2e}, {c.mismatches} mismatch(es){at}")

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
            why = ("integer inputs have none" if np.dtype(self.dtype).kind in "iu"
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


# -- inputs ------------------------------------------------------------------------------------
def make_inputs(case: Case, rng: np.random.Generator, dtype: np.dtype | None = None
                ) -> list[np.ndarray]:
    """Seeded random inputs. Input 0 holds distinct, well-separated values (a permuted grid), so
    ties (MaxPool) and kinks at 0 (Relu) are never within a finite-difference step."""
    dtype = np.dtype(dtype or case.dtype)
    arrays = []
    for i, (shape, bounds) in enumerate(zip(case.shapes, case.ranges)):
        n = math.prod(shape)
        if dtype.kind in "iu":
            a = rng.integers(-10, 10, size=shape)
        elif bounds is not None:
            a = rng.uniform(bounds[0], bounds[1], size=shape)
        elif i == 0:
            # spacing 4/n, and at least a quarter of it away from 0 (the kink of Relu & co)
            a = rng.permutation((np.arange(n) - n / 2 + 0.25) / max(n, 1) * 4.0).reshape(shape)
        else:
            a = rng.standard_normal(shape)
        arrays.append(np.ascontiguousarray(a, dtype=dtype))
    return arrays


def edge_inputs(case: Case, inputs: list[np.ndarray], rng: np.random.Generator
                ) -> list[np.ndarray] | None:
    """The inputs with about an eighth of input 0 replaced by edge values (0, -0, large, tiny)."""
    x = inputs[0]
    if x.dtype.kind != "f" or case.ranges[0] is not None or x.size == 0:
        return None
    large = EDGE_LARGE.get(x.dtype.name, 1e4)
    tiny = float(np.finfo(x.dtype).tiny)
    values = np.array([0.0, -0.0, large, -large, tiny, -tiny, 1.0, -1.0], dtype=x.dtype)
    edged = x.copy().reshape(-1)
    where = rng.choice(x.size, size=max(1, x.size // 8), replace=False)
    edged[where] = values[np.arange(where.size) % values.size]
    return [edged.reshape(x.shape), *inputs[1:]]


# -- comparison --------------------------------------------------------------------------------
def compare(kind: str, name: str, got: Any, want: np.ndarray, rtol: float, atol_frac: float,
            method: str = "elementwise") -> Check:
    """Element-wise: |got - want| <= atol + rtol |want|, atol = atol_frac * max |want|; NaN must
    match NaN, infinities must match exactly; integers exactly."""
    got = np.asarray(got)
    if got.shape != want.shape:
        return Check(kind, name, method, False, math.inf, math.inf, want.size, want.size,
                     note=f"shape {got.shape}, reference {want.shape}")
    if want.dtype.kind in "iub" or got.dtype.kind in "iub":
        bad = got.astype(np.float64) != want.astype(np.float64)
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
        scale = max(float(np.max(np.abs(want), initial=0)), 1.0)
        return _check(kind, name, "exact", bad, diff, scale)
    a, b = got.astype(np.float64), want.astype(np.float64)
    finite_b = np.isfinite(b)
    scale = float(np.max(np.abs(b[finite_b]), initial=0.0)) or 1.0
    with np.errstate(invalid="ignore"):
        diff = np.where(finite_b & np.isfinite(a), np.abs(a - b), np.inf)
        diff = np.where(np.isnan(a) & np.isnan(b), 0.0, diff)
        diff = np.where(np.isinf(b) & (a == b), 0.0, diff)
    bad = diff > atol_frac * scale + rtol * np.where(finite_b, np.abs(b), 0.0)
    return _check(kind, name, method, bad, diff, scale)


def _check(kind: str, name: str, method: str, bad: np.ndarray, diff: np.ndarray,
           scale: float) -> Check:
    idx = np.argwhere(bad)[:5].tolist()
    max_abs = float(np.max(diff, initial=0.0))
    return Check(kind, name, method, not bad.any(), max_abs, max_abs / scale,
                 int(bad.sum()), int(bad.size), idx)


# -- the validation ----------------------------------------------------------------------------
@dataclass
class Options:
    seed: int = 0
    directions: int = 3                 # random directions per input
    elementwise_budget: float = 0.5     # s of finite differences per input for the full Jacobian
    elementwise_max: int = 256          # ... and at most this many elements
    localise_budget: float = 5.0        # s to localise a detected gradient error
    check_gradients: bool = True


@dataclass
class Prepared:
    """A case made concrete: seeded inputs and the reference's outputs on them."""

    case: Case
    rng: np.random.Generator
    inputs: list[np.ndarray]
    reference: Reference
    expected: list[np.ndarray]
    t_ref: float  # seconds of one reference forward

    @property
    def ref_dtype(self) -> np.dtype:
        return self.case.np_dtype if self.case.np_dtype.kind in "iu" else np.dtype(np.float64)


def prepare(case: Case, seed: int = 0) -> Prepared:
    """Inputs and reference outputs of a case; a UsageError when the reference rejects it (bad
    shapes or attributes), before any operator is judged."""
    from d500.operators.reference import infer_outputs
    rng = np.random.default_rng(seed)
    inputs = make_inputs(case, rng)
    infer_outputs(case.op_type, case.attributes, inputs, 1, case.opset)
    exact = case.np_dtype.kind in "iu"
    ref_inputs = [a if exact else a.astype(np.float64) for a in inputs]
    reference = Reference(case.op_type, case.attributes, ref_inputs, 1, case.opset)
    t0 = time.perf_counter()
    expected = reference(ref_inputs)
    return Prepared(case, rng, inputs, reference, expected, time.perf_counter() - t0)


def validate(op_class: type[CustomOperator], case: Case, options: Options | None = None,
             operator_name: str | None = None, prepared: Prepared | None = None) -> Report:
    """Check one operator on one case against the reference; never raises for a wrong operator
    (the Report says what is wrong), raises UsageError for a case the reference rejects."""
    options = options or Options()
    start = time.perf_counter()
    report = Report(case.name, case.op_type, operator_name or op_class.__name__,
                    op_class.framework, case.dtype, [list(s) for s in case.shapes],
                    dict(case.attributes))
    prepared = prepared or prepare(case, options.seed)
    rng, inputs = prepared.rng, prepared.inputs
    exact = case.np_dtype.kind in "iu"
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
    reference, expected, t_ref = prepared.reference, prepared.expected, prepared.t_ref
    if len(outputs) > 1:  # the operator also returns optional outputs: compare those too
        reference = Reference(case.op_type, case.attributes,
                              [a.astype(ref_dtype) for a in inputs], len(outputs), case.opset)
        expected = reference([a.astype(ref_dtype) for a in inputs])
    n_out = min(len(outputs), len(expected))
    out_names = output_names(case.op_type, n_out, case.opset)
    rtol, atol = tolerances.operator_forward(case.np_dtype)

    for k in range(n_out):
        check = compare("output", out_names[k], outputs[k], expected[k], rtol, atol)
        if outputs[k].dtype != expected[k].dtype and not exact and \
                outputs[k].dtype != case.np_dtype and expected[k].dtype.kind == "f":
            check.note = f"returned {outputs[k].dtype}, expected {case.dtype}"
        report.checks.append(check)
    edged = edge_inputs(case, inputs, rng)
    if edged is not None:
        try:
            edge_out = run.forward(edged)
            edge_ref = reference([a.astype(ref_dtype) for a in edged])
            for k in range(n_out):
                report.checks.append(compare("edge output", out_names[k], edge_out[k],
                                             edge_ref[k], rtol, atol))
        except Exception as err:  # noqa: BLE001
            report.error = (f"forward on edge values (0, -0, +-large, +-tiny) raised "
                            f"{describe(err)}")

    if options.check_gradients and not exact and run.has_gradients and not report.error:
        _gradients(run, case, inputs, in_names, outputs[:n_out], reference, t_ref, report,
                   options, rng)
    report.seconds = time.perf_counter() - start
    return report


def _gradients(run: Runner, case: Case, inputs: list[np.ndarray], in_names: list[str],
               outputs: list[np.ndarray], reference: Reference, t_ref: float, report: Report,
               options: Options, rng: np.random.Generator) -> None:
    g64 = [rng.standard_normal(o.shape) if o.dtype.kind == "f" else None for o in outputs]
    grads, gdtype, note = None, None, ""
    attempts = [np.dtype(np.float64)] + ([case.np_dtype] if case.dtype != "float64" else [])
    for dtype in attempts:
        try:
            xs = [a.astype(dtype) for a in inputs]
            gs = [None if g is None else g.astype(dtype) for g in g64]
            _, got = run.gradients(xs, gs)
            if any(g is not None and np.asarray(g).dtype != dtype for g in got):
                raise TypeError(f"gradients returned in another dtype than {dtype}")
            grads, gdtype = got, dtype
            break
        except Exception as err:  # noqa: BLE001
            note = f"backward raised {describe(err)}"
    if grads is None:
        report.error = note
        return
    report.gradients_checked = True
    report.gradient_dtype = gdtype.name
    if all(g is None for g in grads):
        report.error = "backward returned no gradient at all"
        return
    tol = tolerances.operator_gradient(gdtype)
    x64 = [a.astype(np.float64) for a in inputs]
    # the reference is run at the operator's input precision: x64 holds the dtype-rounded values
    gref = [None if g is None else g.astype(gdtype).astype(np.float64) for g in g64]

    def loss(xs: list[np.ndarray]) -> float:
        outs = reference(xs)
        return math.fsum(float(np.sum(o.astype(np.float64) * g)) for o, g in zip(outs, gref)
                         if g is not None)

    noise = 64 * np.finfo(np.float64).eps * math.fsum(
        float(np.sum(np.abs(o.astype(np.float64) * g))) for o, g in zip(reference(x64), gref)
        if g is not None)
    for i, (x, g) in enumerate(zip(x64, grads)):
        name = f"d{in_names[i]}"
        if x.dtype.kind != "f" or inputs[i].dtype.kind != "f":
            continue
        if g is None:
            report.checks.append(Check("gradient", name, "-", True, note="not provided"))
            continue
        g = np.asarray(g, dtype=np.float64)
        if g.shape != x.shape:
            report.checks.append(Check("gradient", name, "-", False, math.inf, math.inf,
                                       x.size, x.size,
                                       note=f"shape {g.shape}, input {x.shape}"))
            continue
        spacing = 4.0 / max(x.size, 1) if i == 0 and case.ranges[0] is None else math.inf
        base_h = 6e-6 * max(1.0, float(np.sqrt(np.mean(x ** 2))) if x.size else 1.0)
        if x.size <= options.elementwise_max and 2 * x.size * t_ref <= options.elementwise_budget:
            report.checks.append(_elementwise(loss, x64, i, g, name, tol, base_h, spacing))
        else:
            report.checks.append(_directional(loss, x64, i, g, name, tol, base_h, spacing,
                                              noise / base_h, options, rng))


def _step(base_h: float, spacing: float, v: np.ndarray) -> float:
    vmax = float(np.max(np.abs(v), initial=0.0)) or 1.0
    return min(base_h, spacing / (8.0 * vmax))


def _derivative(loss, xs: list[np.ndarray], i: int, v: np.ndarray, h: float) -> float:
    plus = [*xs[:i], xs[i] + h * v, *xs[i + 1:]]
    minus = [*xs[:i], xs[i] - h * v, *xs[i + 1:]]
    return (loss(plus) - loss(minus)) / (2.0 * h)


def _elementwise(loss, xs, i, g, name, tol, base_h, spacing) -> Check:
    x = xs[i]
    numeric = np.zeros(x.size)
    h = min(base_h, spacing / 8.0)
    for j in range(x.size):
        v = np.zeros(x.size)
        v[j] = 1.0
        numeric[j] = _derivative(loss, xs, i, v.reshape(x.shape), h)
    return compare("gradient", name, g, numeric.reshape(x.shape), tol, tol, "elementwise")


def _directional(loss, xs, i, g, name, tol, base_h, spacing, noise, options, rng) -> Check:
    x = xs[i]
    n = x.size
    an, fd = [], []
    for _ in range(options.directions):
        v = rng.standard_normal(x.shape)
        fd.append(_derivative(loss, xs, i, v, _step(base_h, spacing, v)))
        an.append(float(np.sum(g * v)))
    scale = math.sqrt(sum(d * d for d in fd) / len(fd)) + noise
    errors = [abs(a - d) / scale for a, d in zip(an, fd)]
    method = f"directional x{len(fd)}"
    check = Check("gradient", name, method, max(errors) <= tol,
                  float(max(abs(a - d) for a, d in zip(an, fd))), float(max(errors)), 0, n)
    if check.passed:
        return check

    def fails(lo: int, hi: int) -> bool:
        v = np.zeros(n)
        v[lo:hi] = rng.standard_normal(hi - lo)
        v = v.reshape(x.shape)
        d = _derivative(loss, xs, i, v, _step(base_h, spacing, v))
        a = float(np.sum(g * v))
        return abs(a - d) > tol * (scale * math.sqrt((hi - lo) / n) + abs(d) + noise)

    deadline = time.perf_counter() + options.localise_budget
    found: list[int] = []
    start = 0
    while len(found) < 3 and start < n and time.perf_counter() < deadline and fails(start, n):
        lo, hi = start, n
        while hi - lo > 1 and time.perf_counter() < deadline:
            mid = (lo + hi) // 2
            if fails(lo, mid):
                hi = mid
            elif fails(mid, hi):
                lo = mid
            else:
                break
        if hi - lo != 1:
            break
        found.append(lo)
        start = lo + 1
    check.first = [[int(k) for k in np.unravel_index(j, x.shape)] for j in found]
    check.mismatches = len(found)
    check.note = (f"localised {len(found)} wrong element(s) by bisection" if found
                  else "error spread too thin to localise within the budget")
    return check
