"""The seeded inputs a level-0 case is checked on: input 0 as a permuted grid at several scales
(x1, x4, x16) inside the operator's domain and the case's declared range, away from kinks, and an
edge-value set (0, -0, +-large, +-tiny, +-1).

Input 0 at scale s is a grid of distinct values spanning [-2s, 2s) (intersected with the
operator's domain, e.g. Log's x > 0, and with the range the case file declares), permuted. Values
lie at least a quarter of the grid spacing from every kink of the operator (Relu's 0, Clip's
bounds), pole and domain end, so a finite-difference step never crosses one (`gradcheck.steps`).
The other inputs are drawn once (standard normal, or uniform in their declared range) and shared
by every scale.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from d500.operators.dtypes import finfo, is_exact, is_float, numpy_dtype

SCALES = (1.0, 4.0, 16.0)
EDGE_LARGE = {"float16": 1e2, "float32": 1e4, "float64": 1e4, "bfloat16": 1e4}
INF = math.inf

# Input 0's open domain, where the operator is defined with a finite derivative.
DOMAINS: dict[str, tuple[float, float]] = {
    "Log": (0.0, INF), "Sqrt": (0.0, INF), "Pow": (0.0, INF),  # Pow: any real exponent
    "Acos": (-1.0, 1.0), "Asin": (-1.0, 1.0), "Atanh": (-1.0, 1.0), "Acosh": (1.0, INF),
}


def _zero(attrs: dict[str, Any], inputs: Sequence[np.ndarray], opset: int) -> list[float]:
    return [0.0]


def _hard_sigmoid(attrs: dict[str, Any], inputs: Sequence[np.ndarray], opset: int
                  ) -> list[float]:
    alpha, beta = float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5))
    return [-beta / alpha, (1.0 - beta) / alpha] if alpha else []


def _clip(attrs: dict[str, Any], inputs: Sequence[np.ndarray], opset: int) -> list[float]:
    if opset < 11:
        return [float(attrs[k]) for k in ("min", "max") if k in attrs]
    return [float(np.asarray(x, dtype=np.float64).reshape(-1)[0]) for x in inputs[1:3]
            if x is not None and np.asarray(x).size == 1]


# Where the derivative with respect to input 0 jumps (the function is smooth on either side).
KINKS: dict[str, Callable[[dict[str, Any], Sequence[np.ndarray], int], list[float]]] = {
    **{op: _zero for op in ("Relu", "LeakyRelu", "PRelu", "Abs", "Elu", "Celu", "Selu")},
    "ThresholdedRelu": lambda a, xs, o: [float(a.get("alpha", 1.0))],
    "Shrink": lambda a, xs, o: [-float(a.get("lambd", 0.5)), float(a.get("lambd", 0.5))],
    "HardSigmoid": _hard_sigmoid,
    "HardSwish": lambda a, xs, o: [-3.0, 3.0],
    "Clip": _clip,
}
# Where the derivative with respect to input 0 is infinite besides the domain ends: near such a
# point the function bends on the scale of the distance to it, and so must the step.
POLES: dict[str, list[float]] = {"Reciprocal": [0.0]}
# Inputs whose values are kinks of input 0 (Clip's bounds): their steps must not cross input 0.
KINK_INPUTS: dict[str, tuple[int, ...]] = {"Clip": (1, 2)}


@dataclass
class InputSet:
    """One set of inputs a case is checked on, with the reference's outputs on it."""

    label: str                      # "x1", "x4", "x16" or "edge"
    inputs: list[np.ndarray]        # in the case's dtype
    kinks: list[float]              # input 0's kinks: no step may cross one
    poles: list[float]              # input 0's domain ends and poles: steps shrink near them
    expected: list[np.ndarray] | None = None  # the reference's outputs (float64), when computed


def _opset(case: Any) -> int:
    from d500.operators.reference import DEFAULT_OPSET
    return case.opset or DEFAULT_OPSET


def kinks(case: Any, inputs: Sequence[np.ndarray]) -> list[float]:
    """Input 0's kinks for this case (from the other inputs' values where they set them, e.g.
    Clip's bounds)."""
    found = KINKS[case.op_type](case.attributes, inputs, _opset(case)) \
        if case.op_type in KINKS else []
    return sorted({float(p) for p in found if math.isfinite(p)})


def poles(case: Any) -> list[float]:
    """Input 0's finite domain ends and poles."""
    found = [*POLES.get(case.op_type, []), *DOMAINS.get(case.op_type, ())]
    return sorted({float(p) for p in found if math.isfinite(p)})


def kink_inputs(case: Any) -> tuple[int, ...]:
    """The inputs whose values are kinks of input 0."""
    if case.op_type == "Clip" and _opset(case) < 11:
        return ()
    return KINK_INPUTS.get(case.op_type, ())


def bounds(case: Any) -> tuple[float, float]:
    """Where input 0 may lie: the operator's domain within the case's declared range."""
    lo, hi = DOMAINS.get(case.op_type, (-INF, INF))
    declared = case.ranges[0] if case.ranges else None
    if declared is not None:
        lo, hi = max(lo, declared[0]), min(hi, declared[1])
    return lo, hi


def interval(case: Any, scale: float) -> tuple[float, float]:
    """The span of input 0's grid at `scale`: [-2 scale, 2 scale) within `bounds(case)`; a span
    the bounds miss entirely becomes the bounds (a finite end, and 4 scale wide)."""
    lo, hi = bounds(case)
    a, b = max(-2.0 * scale, lo), min(2.0 * scale, hi)
    if a < b:
        return a, b
    width = 4.0 * scale
    a = lo if math.isfinite(lo) else hi - width
    b = hi if math.isfinite(hi) else a + width
    return a, b


def _grid(shape: tuple[int, ...], span: tuple[float, float], rng: np.random.Generator
          ) -> np.ndarray:
    n = math.prod(shape)
    lo, hi = span
    step = (hi - lo) / max(n, 1)
    return rng.permutation(lo + (np.arange(n) + 0.25) * step).reshape(shape)


def _away(x: np.ndarray, span: tuple[float, float], points: Sequence[float]) -> np.ndarray:
    """Grid values within a quarter spacing of a breakpoint moved to a quarter spacing from it
    (on their side), which keeps them at least half a spacing from their neighbours."""
    quarter = (span[1] - span[0]) / max(x.size, 1) / 4.0
    x = x.copy()
    for c in points:
        near = np.abs(x - c) < quarter
        if near.any():
            x[near] = c + np.where(x[near] >= c, quarter, -quarter)
    return x


def make_inputs(case: Any, rng: np.random.Generator, dtype: Any = None, scale: float = 1.0
                ) -> list[np.ndarray]:
    """Seeded random inputs at `scale`: input 0 a permuted grid (distinct values, away from
    breakpoints, so ties such as MaxPool's and kinks such as Relu's are never within a
    finite-difference step), the others standard normal or uniform in their declared range."""
    dtype = numpy_dtype(dtype or case.dtype)
    arrays = []
    span = interval(case, scale)
    for i, (shape, declared) in enumerate(zip(case.shapes, case.ranges)):
        if is_exact(dtype):
            a = rng.integers(-10, 10, size=shape)
        elif i == 0:
            a = _grid(tuple(shape), span, rng)
        elif declared is not None:
            a = rng.uniform(declared[0], declared[1], size=shape)
        else:
            a = rng.standard_normal(shape)
        arrays.append(np.array(a, dtype=dtype, order="C"))
    if arrays and is_float(dtype):
        x0 = _away(arrays[0].astype(np.float64), span, [*kinks(case, arrays), *poles(case)])
        arrays[0] = np.array(x0, dtype=dtype, order="C")
    return arrays


def scaled_sets(case: Any, base: list[np.ndarray], seed: int,
                scales: Sequence[float] = SCALES) -> list[InputSet]:
    """The x1 set (`base`) and, for each further scale whose span differs from those before,
    the same inputs with input 0 redrawn at that scale (its own seeded stream)."""
    sets = [InputSet("x1", base, kinks(case, base), poles(case))]
    if not base or not is_float(base[0].dtype):
        return sets
    seen = {interval(case, 1.0)}
    for k, scale in enumerate(scales):
        span = interval(case, scale)
        if span in seen:
            continue
        seen.add(span)
        rng = np.random.default_rng([seed, k + 1])
        x0 = _grid(base[0].shape, span, rng)
        bent = kinks(case, base)
        x0 = np.array(_away(x0, span, [*bent, *poles(case)]), dtype=base[0].dtype, order="C")
        sets.append(InputSet(f"x{scale:g}", [x0, *base[1:]], bent, poles(case)))
    return sets


def edge_inputs(case: Any, inputs: list[np.ndarray], rng: np.random.Generator
                ) -> list[np.ndarray] | None:
    """The inputs with about an eighth of input 0 replaced by edge values (0, -0, +-large,
    +-tiny, +-1; those inside the operator's domain and the declared range). The large and tiny
    values vary within a factor of 2 so that they are distinct where the dtype allows."""
    x = inputs[0] if inputs else None
    if x is None or not is_float(x.dtype) or x.size == 0:
        return None
    large = EDGE_LARGE.get(x.dtype.name, 1e4)
    tiny = float(finfo(x.dtype).tiny)
    values = np.array([0.0, -0.0, large, -large, tiny, -tiny, 1.0, -1.0])
    lo, hi = DOMAINS.get(case.op_type, (-INF, INF))
    inside = (values > lo) & (values < hi)
    declared = case.ranges[0] if case.ranges else None
    if declared is not None:
        inside &= (values >= declared[0]) & (values <= declared[1])
    values = values[inside]
    if values.size == 0:
        return None
    m = max(1, x.size // 8)
    where = rng.choice(x.size, size=m, replace=False)
    kind = np.arange(m) % values.size
    vary = 1.0 + (np.arange(m) // values.size) / max(1, -(-m // values.size))
    varied = np.abs(values[kind]) != 1.0
    picked = values[kind] * np.where(varied & (values[kind] != 0.0), vary, 1.0)
    edged = x.astype(np.float64).reshape(-1)
    edged[where] = picked
    return [np.array(edged.reshape(x.shape), dtype=x.dtype, order="C"), *inputs[1:]]
