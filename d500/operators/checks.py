"""One compared tensor of a level-0 validation (`Check`) and the element-wise comparison that makes
one (`compare`): an output against the reference, or a gradient against finite differences."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from d500.operators.dtypes import is_exact


@dataclass
class Check:
    """One compared tensor: an output (forward) or an input's gradient, on one input set."""

    kind: str            # "output" | "output x4" | "edge output" | "gradient" | "gradient x4" ...
    name: str
    method: str          # "elementwise" | "directional xN" | "joint xN" | "exact" | "-"
    passed: bool
    max_abs: float = 0.0
    max_rel: float = 0.0  # max |error| / scale (scale: max |reference|, or the derivative's RMS)
    mismatches: int = 0
    checked: int = 0
    first: list[list[int]] = field(default_factory=list)
    note: str = ""
    tolerance: float | None = None  # what max_rel was held to (directional, joint: relative)

    @property
    def random_directions(self) -> bool:
        """Compared along random directions (derivatives of sums), not element by element."""
        return self.method.startswith(("directional", "joint"))

    def line(self) -> str:
        status = "ok" if self.passed else "FAIL"
        where = f"  first at {', '.join(map(str, map(tuple, self.first)))}" if self.first else ""
        note = f"  ({self.note})" if self.note else ""
        if self.random_directions and not self.passed and not self.mismatches:
            count = f"not localised/{self.checked}"
        else:
            count = f"{'>=' if self.random_directions and self.mismatches else ''}" \
                    f"{self.mismatches}/{self.checked}"
        return (f"  {self.kind:<14} {self.name:<6} {self.method:<15} max abs {self.max_abs:9.2e}"
                f"  max rel {self.max_rel:9.2e}  mismatches {count}  {status}{where}{note}")

    def verdict(self) -> str:
        """What was compared and how it failed, in words (the summary of a failed check)."""
        bound = f" > tolerance {self.tolerance:.1e}" if self.tolerance is not None else ""
        first = f", first at {tuple(self.first[0])}" if self.first else ""
        if not self.random_directions:
            return (f"{self.mismatches} of {self.checked} element(s) outside the tolerance, "
                    f"max rel error {self.max_rel:.2e}{first}")
        count = self.method.split("x")[-1]
        what = (f"its derivatives along {count} random directions ({self.method}) differ from "
                f"finite differences of the reference: max rel error {self.max_rel:.2e}{bound}")
        if self.mismatches:
            return f"{what}; bisection found at least {self.mismatches} wrong element(s){first}"
        return (f"{what}; the error could not be pinned to single elements of the "
                f"{self.checked} ({self.note or 'spread over many of them'})")


def compare(kind: str, name: str, got: Any, want: np.ndarray, rtol: float, atol_frac: float,
            method: str = "elementwise") -> Check:
    """Element-wise: |got - want| <= atol + rtol |want|, atol = atol_frac * max |want|; NaN must
    match NaN, infinities must match exactly; integers exactly."""
    got = np.asarray(got)
    if got.shape != want.shape:
        return Check(kind, name, method, False, math.inf, math.inf, want.size, want.size,
                     note=f"shape {got.shape}, reference {want.shape}")
    if is_exact(want.dtype) or is_exact(got.dtype):
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
