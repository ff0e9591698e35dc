"""Comparing a backend's network outputs with a baseline's: errors relative to the output's scale.

Tolerance: `d500.tolerances.network` by dtype (its docstring says why it is what it is): an
output agrees when max|a - b| <= rtol * max|b| over its finite elements, with NaN and ±inf in the
same places and exact equality for integers and booleans.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from d500 import tolerances


def rtol_for(dtype: np.dtype, precision: str | None = None) -> float:
    """The tolerance for outputs of `dtype` (0 for integers and booleans: exact); a backend
    mode that computes in a lower `precision` (openvino:bf16: "bfloat16") is judged at the
    looser of the two for float outputs."""
    tol = tolerances.network(dtype)
    if precision is not None and np.dtype(dtype).kind in "fc":
        tol = max(tol, tolerances.network(precision))
    return tol


@dataclass
class Comparison:
    """One output of one backend against the baseline."""

    output: str
    max_abs: float
    max_rel: float  # max_abs / the baseline output's largest finite magnitude
    rtol: float
    ok: bool
    note: str = ""

    def as_dict(self) -> dict:
        return {"output": self.output, "max_abs": _num(self.max_abs),
                "max_rel": _num(self.max_rel), "rtol": self.rtol, "ok": self.ok,
                "note": self.note}


def _num(x: float) -> float | str:
    """JSON has no inf/NaN: they become strings."""
    return x if np.isfinite(x) else str(x)


def compare(name: str, got: np.ndarray, want: np.ndarray, rtol: float | None = None,
            precision: str | None = None) -> Comparison:
    """Compare `got` with the baseline `want` (see the module docstring for the rule);
    `precision`: the dtype the backend computed in when lower (d500.backends.base.Executable)."""
    got, want = np.asarray(got), np.asarray(want)
    tol = rtol_for(want.dtype, precision) if rtol is None else rtol
    if got.shape != want.shape:
        return Comparison(name, np.inf, np.inf, tol, False,
                          f"shape {_shape(got)} instead of {_shape(want)}")
    if want.dtype.kind not in "fciub" or got.dtype.kind not in "fciub":
        same = bool(np.array_equal(got, want))
        return Comparison(name, 0.0 if same else np.inf, 0.0 if same else np.inf, 0.0, same,
                          "" if same else "values differ")
    if want.dtype.kind in "iub" and got.dtype.kind in "iub":
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
        max_abs = float(diff.max()) if diff.size else 0.0
        scale = float(np.abs(want).max()) if want.size else 0.0
        rel = _rel(max_abs, scale)
        bad = int(np.count_nonzero(diff))
        return Comparison(name, max_abs, rel, 0.0, bad == 0,
                          f"{bad} of {diff.size} elements differ" if bad else "")
    g = got.astype(np.complex128 if got.dtype.kind == "c" else np.float64)
    w = want.astype(np.complex128 if want.dtype.kind == "c" else np.float64)
    g_nan, w_nan = np.isnan(g), np.isnan(w)
    if not np.array_equal(g_nan, w_nan):
        n = int(np.count_nonzero(g_nan != w_nan))
        return Comparison(name, np.inf, np.inf, tol, False, f"NaN in {n} other place(s)")
    g_inf, w_inf = np.isinf(g), np.isinf(w)
    if not np.array_equal(g_inf, w_inf) or not np.array_equal(g[g_inf], w[w_inf]):
        return Comparison(name, np.inf, np.inf, tol, False, "infinities differ")
    finite = ~(w_nan | w_inf)
    diff = np.abs(g[finite] - w[finite])
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(w[finite]).max()) if diff.size else 0.0
    rel = _rel(max_abs, scale)
    ok = rel <= tol
    note = ""
    if not ok:
        bad = int(np.count_nonzero(diff > tol * scale))
        note = f"{bad} of {diff.size} elements beyond tolerance"
    return Comparison(name, max_abs, rel, tol, ok, note)


def _rel(max_abs: float, scale: float) -> float:
    if max_abs == 0:
        return 0.0
    return max_abs / scale if scale > 0 else np.inf


def _shape(a: np.ndarray) -> str:
    return "x".join(map(str, a.shape)) or "scalar"
