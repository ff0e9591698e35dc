"""Gradients judged by central finite differences of the reference forward in float64.

The reference loss is L(x) = sum_k <output_k(x), g_k> for random output gradients g. A check
perturbs an input by u (per element at most `CLIP` times its step a_j) and compares <backward(g),
u> with (L(x + u) - L(x - u)) / 2; it passes when the difference is at most tol times the
derivatives' RMS plus a generous bound on L's rounding (`Loss.noise`). Input 0's steps keep every
perturbation below an eighth of the distance to its nearest distinct value and to each kink, and
shrink with the distance to a pole or domain end, so no step crosses a tie (MaxPool) or a kink
(Relu); elements of input 0 with equal values (low-precision dtypes round the grid into ties)
move together, which is a valid direction whichever of them an operator routes the gradient to.

- `elementwise`: the Jacobian-vector product element by element (small inputs);
- `directional`: a few random directions, and on failure bisection to locate wrong elements;
- `joint`: one random direction over every input at once, each input's share of the derivative
  scaled to the same size so that a wrong small gradient is not drowned by a large one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

from d500.operators.checks import Check, compare

FD_REL = 6e-6  # the base step, relative to the input's RMS (at least 1)
CLIP = 4.0     # direction entries are standard normal clipped to [-CLIP, CLIP], times the step
EPS64 = float(np.finfo(np.float64).eps)


class Loss:
    """L(x) = sum_k <output_k(x), g_k> of the reference forward, over the output elements whose
    g is non-zero (an edge set zeroes g where the reference output is not finite)."""

    def __init__(self, reference, grads: Sequence[np.ndarray | None]):
        self.reference = reference
        self.grads = list(grads)

    def _terms(self, outputs: Sequence[np.ndarray], magnitude: bool) -> float:
        total = []
        with np.errstate(invalid="ignore", over="ignore"):
            for o, g in zip(outputs, self.grads):
                if g is None:
                    continue
                t = o.astype(np.float64) * g
                total.append(float(np.sum(np.where(g != 0, np.abs(t) if magnitude else t, 0.0))))
        return math.fsum(total)

    def __call__(self, xs: Sequence[np.ndarray]) -> float:
        return self._terms(self.reference(list(xs)), magnitude=False)

    def noise(self, outputs: Sequence[np.ndarray]) -> float:
        """A generous bound on the rounding error of L where the reference gave `outputs`:
        64 eps sum |o g|."""
        return 64 * EPS64 * self._terms(outputs, magnitude=True)


def choose_method(size: int, reference_seconds: float, budget: float, max_elements: int) -> str:
    """"elementwise" (2 reference calls per element) when the input has at most `max_elements`
    elements and those calls fit in `budget` seconds at `reference_seconds` each; otherwise
    "directional"."""
    if size <= max_elements and 2 * size * reference_seconds <= budget:
        return "elementwise"
    return "directional"


def steps(x: np.ndarray, first: bool, kinks: Sequence[float] = (), poles: Sequence[float] = (),
          absolute: bool = False) -> np.ndarray:
    """Per-element step a_j: FD_REL times the input's RMS (at least 1; `absolute`: times 1). For
    input 0 (`first`) at most 1/(8 CLIP) of the distance to the nearest distinct value and to
    each kink (no step crosses one), and FD_REL times the distance to each pole or domain end
    (the function bends on that scale there). 0 where an element may not move."""
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return np.zeros(x.shape)
    finite = np.isfinite(x)
    rms = float(np.sqrt(np.mean(np.square(x[finite])))) if finite.any() else 1.0
    a = np.full(x.shape, FD_REL * (1.0 if absolute else max(1.0, rms)))
    if first:
        flat = x.reshape(-1)
        uniq, inv = np.unique(flat, return_inverse=True)
        if uniq.size > 1:
            d = np.diff(uniq)
            gap = np.minimum(np.r_[np.inf, d], np.r_[d, np.inf])
            a = np.minimum(a, (gap / (8 * CLIP))[inv].reshape(x.shape))
        for c in kinks:
            a = np.minimum(a, np.abs(x - c) / (8 * CLIP))
        for c in poles:
            a = np.minimum(a, np.abs(x - c) * FD_REL)
    a[~finite] = 0.0
    return a


def clear_of(a: np.ndarray, value: np.ndarray, x0: np.ndarray) -> np.ndarray:
    """Steps of an input whose value is a kink of input 0 (Clip's bounds), shrunk so that they
    and input 0's never cross: at most 1/(8 CLIP) of the distance to input 0's nearest value."""
    v = float(np.asarray(value, dtype=np.float64).reshape(-1)[0]) if np.size(value) else 0.0
    finite = np.asarray(x0, dtype=np.float64)[np.isfinite(x0)]
    dist = float(np.min(np.abs(finite - v), initial=np.inf))
    return np.minimum(a, dist / (8 * CLIP))


def ties(x: np.ndarray) -> tuple[np.ndarray, int] | None:
    """For input 0: each element's group of equal values and the number of groups, or None
    when all values are distinct."""
    uniq, inv = np.unique(np.asarray(x).reshape(-1), return_inverse=True)
    return None if uniq.size == x.size else (inv.reshape(-1), int(uniq.size))


def direction(rng: np.random.Generator, a: np.ndarray,
              tie: tuple[np.ndarray, int] | None) -> np.ndarray:
    """A random perturbation: clipped standard normal times the steps (tied elements equal)."""
    if tie is None:
        r = rng.standard_normal(a.shape)
    else:
        r = rng.standard_normal(tie[1])[tie[0]].reshape(a.shape)
    return np.clip(r, -CLIP, CLIP) * a


def dot(g: np.ndarray, u: np.ndarray) -> float:
    """<g, u> over the elements u moves (a NaN there stays NaN: a wrong gradient)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return float(np.sum(np.where(u != 0, np.asarray(g, dtype=np.float64) * u, 0.0)))


def derivative(loss: Loss, xs: list[np.ndarray], i: int, u: np.ndarray) -> float:
    """(L(x + u) - L(x - u)) / 2, u added to input i."""
    plus = [*xs[:i], xs[i] + u, *xs[i + 1:]]
    minus = [*xs[:i], xs[i] - u, *xs[i + 1:]]
    return (loss(plus) - loss(minus)) / 2.0


def _error(analytic: float, numeric: float, scale: float) -> float:
    e = abs(analytic - numeric) / scale if scale > 0 else abs(analytic - numeric)
    return e if math.isfinite(e) else math.inf


def elementwise(loss: Loss, xs: list[np.ndarray], i: int, g: np.ndarray, name: str, tol: float,
                a: np.ndarray, tie: tuple[np.ndarray, int] | None, kind: str = "gradient"
                ) -> Check:
    """The Jacobian-vector product element by element (tied elements of input 0 as one)."""
    x = xs[i]
    gflat, aflat = np.asarray(g, dtype=np.float64).reshape(-1), a.reshape(-1)
    if tie is None:
        groups, n = np.arange(x.size), x.size
    else:
        groups, n = tie
    with np.errstate(invalid="ignore"):
        analytic = np.bincount(groups, weights=gflat, minlength=n) if n else np.zeros(0)
    numeric = analytic.copy()
    fixed = 0
    for k in range(n):
        members = groups == k
        h = float(aflat[members][0])
        if h == 0.0:
            fixed += 1
            continue
        numeric[k] = derivative(loss, xs, i, (members * h).reshape(x.shape)) / h
    if tie is None:
        check = compare(kind, name, g, numeric.reshape(x.shape), tol, tol, "elementwise")
    else:
        check = compare(kind, name, analytic, numeric, tol, tol, "elementwise")
        first = [int(np.argmax(groups == k)) for (k,) in check.first]
        check.first = [[int(j) for j in np.unravel_index(f, x.shape)] for f in first]
        check.note = f"{x.size - n} tied element(s) moved with their equals"
    if fixed:
        check.note = (check.note + "; " if check.note else "") + (
            f"{fixed} on a kink or domain end not checked")
    return check


def directional(loss: Loss, xs: list[np.ndarray], i: int, g: np.ndarray, name: str, tol: float,
                a: np.ndarray, tie: tuple[np.ndarray, int] | None, noise: float,
                directions: int, localise_budget: float, rng: np.random.Generator,
                kind: str = "gradient") -> Check:
    """`directions` random directional derivatives; on failure, bisection over the flattened
    input to locate (up to three) wrong elements within `localise_budget` seconds."""
    x = xs[i]
    n = x.size
    h = float(np.max(a, initial=0.0))
    if h == 0.0:
        return Check(kind, name, "-", True, checked=n, note="no element can move (all on kinks)")
    an, fd = [], []
    for _ in range(directions):
        u = direction(rng, a, tie)
        fd.append(derivative(loss, xs, i, u) / h)
        an.append(dot(g, u) / h)
    noise = noise / h
    rms = math.sqrt(sum(d * d for d in fd) / len(fd))
    scale = rms + noise / tol  # passes when |error| <= tol * rms + the loss's rounding
    errors = [_error(p, q, scale) for p, q in zip(an, fd)]
    diffs = [abs(p - q) if math.isfinite(abs(p - q)) else math.inf for p, q in zip(an, fd)]
    method = f"directional x{len(fd)}"
    check = Check(kind, name, method, max(errors) <= tol, max(diffs), max(errors), 0, n,
                  note=_weak(rms, noise, tol), tolerance=tol)
    if check.passed:
        return check

    def fails(lo: int, hi: int) -> bool:
        u = direction(rng, a, tie).reshape(-1)
        u[:lo] = 0.0
        u[hi:] = 0.0
        u = u.reshape(x.shape)
        d = derivative(loss, xs, i, u) / h
        p = dot(g, u) / h
        err = abs(p - d)
        return not math.isfinite(err) or err > tol * (rms * math.sqrt((hi - lo) / n)
                                                      + abs(d)) + noise

    deadline = time.perf_counter() + localise_budget
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


def joint(loss: Loss, xs: list[np.ndarray], grads: Sequence[np.ndarray | None], tol: float,
          a: Sequence[np.ndarray | None], tie0: tuple[np.ndarray, int] | None, noise: float,
          directions: int, rng: np.random.Generator, kind: str) -> Check:
    """Random directions over every input at once (inputs with a gradient and a step array).
    Each input's steps are shrunk so that its expected share |g_i . a_i| is the same, so every
    input's relative error counts alike; never below 1e-3 of the largest share, nor below
    noise / tol, where the loss's rounding would start to count against the tolerance."""
    idx = [i for i, (g, s) in enumerate(zip(grads, a)) if g is not None and s is not None]
    share = {}
    for i in idx:
        with np.errstate(invalid="ignore", over="ignore"):
            v = float(np.sqrt(np.nansum(np.square(np.asarray(grads[i], np.float64) * a[i]))))
        share[i] = v if math.isfinite(v) else 0.0
    positive = [v for v in share.values() if v > 0]
    c = max(min(positive), 1e-3 * max(positive), noise / tol) if positive else 1.0
    steps_ = {i: a[i] * (c / share[i] if share[i] > c else 1.0) for i in idx}
    checked = sum(xs[i].size for i in idx)
    an, fd = [], []
    for _ in range(directions):
        us = {i: direction(rng, steps_[i], tie0 if i == 0 else None) for i in idx}
        plus = [x + us[i] if i in us else x for i, x in enumerate(xs)]
        minus = [x - us[i] if i in us else x for i, x in enumerate(xs)]
        fd.append((loss(plus) - loss(minus)) / 2.0 / c)
        an.append(math.fsum(dot(grads[i], us[i]) for i in idx) / c)
    rms = math.sqrt(sum(d * d for d in fd) / len(fd))
    scale = rms + noise / c / tol
    errors = [_error(p, q, scale) for p, q in zip(an, fd)]
    diffs = [abs(p - q) if math.isfinite(abs(p - q)) else math.inf for p, q in zip(an, fd)]
    if not all(math.isfinite(d) for d in fd):
        return Check(kind, "all", f"joint x{len(fd)}", True, checked=checked,
                     note="not checked: the reference loss is not finite near these inputs")
    return Check(kind, "all", f"joint x{len(fd)}", max(errors) <= tol, max(diffs), max(errors),
                 0, checked, note=_weak(rms, noise / c, tol), tolerance=tol)


def _weak(rms: float, noise: float, tol: float) -> str:
    """A note when the loss's rounding allowance makes the check blind to relative errors ten
    times the tolerance or more."""
    reach = tol + noise / rms if rms > 0 else math.inf
    return "" if reach < 10 * tol else (
        f"weak: rounding hides relative errors below {reach:.0e}")
