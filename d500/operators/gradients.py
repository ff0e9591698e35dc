"""The gradient part of a level-0 validation: the operator's backward on every input set, judged
by `gradcheck` against finite differences of the reference forward in float64.

The backward runs in float64 when the operator accepts it (a backward's correctness is then seen
to 1e-6), else in the case's dtype. At x1 every input is checked alone; once x1 passes, each
further scale and the edge values get one joint directional check over all inputs, and a joint
check that fails is followed by per-input checks that name and locate the wrong gradient.

Where the reference output is not finite in the backward's dtype, or beyond the square root of
its largest value (a backward may overflow on the way, as Pow's b * x^(b-1) does in x^(b-1)),
that output gets no output gradient, and the input elements that reach it do not move: the
reference backend's own gradient (its NumPy VJP), seeded with NaN there, marks them (NaN * 0 is
NaN). On the edge values only elements where that reference gradient is finite (and below the
same limit) move, and the output gradient is divided by max(1, |y|) so that huge outputs do not
make the loss's rounding hide the steps' derivatives.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from d500 import tolerances
from d500.errors import D500Error, describe
from d500.operators import gradcheck
from d500.operators.adapters import Runner
from d500.operators.checks import Check
from d500.operators.dtypes import finfo, is_float, saturate
from d500.operators.inputs import InputSet, kink_inputs

Grads = list[np.ndarray | None]


def check_gradients(run: Runner, case: Any, sets: list[InputSet], edge: InputSet | None,
                    in_names: list[str], outputs: list[np.ndarray], reference: Any,
                    t_ref: float, report: Any, options: Any, rng: np.random.Generator) -> None:
    """Append the gradient checks of every input set to `report` (or set `report.error`)."""
    base = sets[0]
    g64 = [rng.standard_normal(o.shape) if is_float(o.dtype) else None for o in outputs]
    grads, gdtype, note = None, None, ""
    attempts = [np.dtype(np.float64)] + ([case.np_dtype] if case.dtype != "float64" else [])
    for dtype in attempts:
        try:
            got = _backward(run, base.inputs, g64, dtype)
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
    # the reference runs at the operator's input precision: x64 holds the dtype-rounded values
    gref = [None if g is None else g.astype(gdtype).astype(np.float64) for g in g64]
    try:
        g_base, steps = _restrict(case, base, gref, gdtype)
    except Exception:  # noqa: BLE001 - no reference gradient to restrict by: check it all
        g_base, steps = gref, None
    if steps is not None:
        try:
            grads = _backward(run, base.inputs, g_base, gdtype)
        except Exception as err:  # noqa: BLE001
            report.error = f"backward raised {describe(err)}"
            return
    loss = gradcheck.Loss(reference, g_base)
    x64 = [a.astype(np.float64) for a in base.inputs]
    noise = loss.noise(base.expected)
    for i, (x, g) in enumerate(zip(x64, grads)):
        name = f"d{in_names[i]}"
        if not is_float(base.inputs[i].dtype):
            continue
        check = _shape_check("gradient", name, g, x)
        if check is not None:
            report.checks.append(check)
            continue
        g = np.asarray(g, dtype=np.float64)
        a = _steps(case, x64, i, base) if steps is None else steps[i]
        tie = gradcheck.ties(x) if i == 0 else None
        method = gradcheck.choose_method(x.size, t_ref, options.elementwise_budget,
                                         options.elementwise_max)
        if method == "elementwise":
            report.checks.append(gradcheck.elementwise(loss, x64, i, g, name, tol, a, tie))
        else:
            report.checks.append(gradcheck.directional(
                loss, x64, i, g, name, tol, a, tie, noise, options.directions,
                options.localise_budget, rng))
    if any(not c.passed for c in report.checks if c.kind == "gradient"):
        return  # wrong already: the further sets would say the same, slower
    for extra in sets[1:]:
        _joint(run, case, extra, gref, reference, gdtype, tol, in_names,
               f"gradient {extra.label}", report, options, rng)
    if edge is not None and options.edge_gradients:
        _joint(run, case, edge, gref, reference, gdtype, tol, in_names, "edge gradient",
               report, options, rng, edge=True)


def _backward(run: Runner, inputs: list[np.ndarray], g64: Grads, dtype: np.dtype) -> list[Any]:
    xs = [a.astype(dtype) if is_float(a.dtype) else a for a in inputs]
    gs = [None if g is None else g.astype(dtype) for g in g64]
    _, got = run.gradients(xs, gs)
    if any(g is not None and np.asarray(g).dtype != dtype for g in got):
        raise TypeError(f"gradients returned in another dtype than {dtype}")
    return got


def _steps(case: Any, x64: list[np.ndarray], i: int, inputs: InputSet,
           absolute: bool = False) -> np.ndarray:
    """Input i's finite-difference steps on an input set (`gradcheck.steps`)."""
    a = gradcheck.steps(x64[i], i == 0, inputs.kinks, inputs.poles, absolute)
    if i in kink_inputs(case):
        a = gradcheck.clear_of(a, x64[i], x64[0])
    return a


def _restrict(case: Any, inputs: InputSet, gref: Grads, gdtype: np.dtype, edge: bool = False
              ) -> tuple[Grads, list[np.ndarray | None] | None]:
    """The output gradients the operator gets on this set, and the steps restricted to where
    the reference gradient is defined (None: no restriction, the default steps)."""
    from d500.operators.reference import reference_gradients
    limit = math.sqrt(float(finfo(gdtype).max))
    held = saturate(list(inputs.expected or []), gdtype)
    g_op, g_nan, bad = [], [], False
    for g, o in zip(gref, held):
        if g is None:
            g_op.append(None)
            g_nan.append(None)
            continue
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(o) & (np.abs(o) <= limit)
        bad = bad or not ok.all()
        if edge:
            g = g / np.maximum(1.0, np.abs(np.where(ok, o, 1.0)))
            g = g.astype(gdtype).astype(np.float64)  # what the operator receives
        g_op.append(np.where(ok, g, 0.0))
        g_nan.append(np.where(ok, g, np.nan))
    if not bad and not edge:
        return gref, None
    x64 = [a.astype(np.float64) for a in inputs.inputs]
    ref_grads = reference_gradients(case.op_type, case.attributes, x64, g_nan, case.opset)
    # in half precision also the derivative itself (seeded with max|g| everywhere) must stay
    # below the limit: a small g_j would hide an intermediate that overflows
    wide = None
    if float(finfo(gdtype).max) < 1e300:
        seeds = [None if g is None else np.where(np.isnan(g), np.nan, np.nanmax(np.abs(g)))
                 for g in g_nan]
        wide = reference_gradients(case.op_type, case.attributes, x64, seeds, case.opset)
    steps: list[np.ndarray | None] = []
    for i, x in enumerate(x64):
        r = ref_grads[i] if i < len(ref_grads) else None
        if not is_float(inputs.inputs[i].dtype) or r is None:
            steps.append(None)
            continue
        with np.errstate(invalid="ignore"):
            defined = np.abs(np.asarray(r, dtype=np.float64)) <= limit  # False for NaN, inf
            if wide is not None and wide[i] is not None:
                defined &= np.abs(np.asarray(wide[i], dtype=np.float64)) <= limit
        steps.append(np.where(defined, _steps(case, x64, i, inputs, absolute=edge and i == 0),
                              0.0))
    return g_op, steps


def _shape_check(kind: str, name: str, g: Any, x: np.ndarray) -> Check | None:
    if g is None:
        return Check(kind, name, "-", True, note="not provided")
    if np.shape(g) != x.shape:
        return Check(kind, name, "-", False, math.inf, math.inf, x.size, x.size,
                     note=f"shape {np.shape(g)}, input {x.shape}")
    return None


def _joint(run: Runner, case: Any, inputs: InputSet, gref: Grads, reference: Any,
           gdtype: np.dtype, tol: float, in_names: list[str], kind: str, report: Any,
           options: Any, rng: np.random.Generator, edge: bool = False) -> None:
    """One joint directional check on an input set; per-input checks when it fails."""
    try:
        g_op, steps = _restrict(case, inputs, gref, gdtype, edge)
    except D500Error as err:
        if edge:
            report.checks.append(Check(kind, "all", "-", True, note=f"not checked: {err}"))
            return
        g_op, steps = gref, None
    except Exception as err:  # noqa: BLE001 - the reference's VJP failing is not the operator's
        if edge:
            report.checks.append(Check(kind, "all", "-", True,
                                       note=f"not checked: the reference backward raised "
                                            f"{describe(err)}"))
            return
        g_op, steps = gref, None
    try:
        got = _backward(run, inputs.inputs, g_op, gdtype)
    except Exception as err:  # noqa: BLE001
        report.checks.append(Check(kind, "all", "-", False,
                                   note=f"backward raised {describe(err)}"))
        return
    x64 = [a.astype(np.float64) for a in inputs.inputs]
    grads: Grads = []
    for i, (x, g) in enumerate(zip(x64, got)):
        if not is_float(inputs.inputs[i].dtype) or g is None:
            grads.append(None)
            continue
        bad = _shape_check(kind, f"d{in_names[i]}", g, x)
        if bad is not None:
            report.checks.append(bad)
            return
        grads.append(np.asarray(g, dtype=np.float64))
    if steps is None:
        steps = [None if g is None else _steps(case, x64, i, inputs)
                 for i, g in enumerate(grads)]
    loss = gradcheck.Loss(reference, g_op)
    tie0 = gradcheck.ties(x64[0]) if x64 else None
    noise = loss.noise(inputs.expected)
    check = gradcheck.joint(loss, x64, grads, tol, steps, tie0, noise, options.directions, rng,
                            kind)
    if check.passed:
        report.checks.append(check)
        return
    per = [gradcheck.directional(loss, x64, i, g, f"d{in_names[i]}", tol, steps[i],
                                 tie0 if i == 0 else None, noise, options.directions,
                                 options.localise_budget, rng, kind)
           for i, g in enumerate(grads) if g is not None and steps[i] is not None]
    report.checks.extend(per if any(not c.passed for c in per) else [check])
