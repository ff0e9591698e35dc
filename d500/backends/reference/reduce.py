"""NumPy VJPs of the reductions: ReduceSum, ReduceMean."""

from __future__ import annotations

import numpy as np

from d500.backends.graph import registry
from d500.backends.reference.table import Grad, Step, like

VJP, op = registry()


def _reduce_axes(s: Step) -> tuple[int, ...] | None:
    """The reduced axes (None: nothing reduced); attribute or second input by opset."""
    x = s.x[0]
    axes = s.x[1] if len(s.x) > 1 and s.x[1] is not None else s.attr("axes")
    if axes is None or len(axes) == 0:
        if s.attr("noop_with_empty_axes", 0):
            return None
        return tuple(range(x.ndim))
    return tuple(sorted(int(a) % x.ndim for a in np.asarray(axes).ravel()))


def _reduce_back(s: Step, g: np.ndarray) -> tuple[np.ndarray, int]:
    x = s.x[0]
    axes = _reduce_axes(s)
    if axes is None:
        return np.asarray(g), 1
    g = np.asarray(g)
    if not s.attr("keepdims", 1):
        g = np.expand_dims(g, axes)
    return np.broadcast_to(g, x.shape), int(np.prod([x.shape[a] for a in axes]))


@op
def ReduceSum(s: Step, g: list[Grad]) -> list[Grad]:
    gx, _ = _reduce_back(s, g[0])
    return [like(gx, s.x[0])] + [None] * (len(s.x) - 1)


@op
def ReduceMean(s: Step, g: list[Grad]) -> list[Grad]:
    gx, count = _reduce_back(s, g[0])
    return [like(gx / count, s.x[0])] + [None] * (len(s.x) - 1)
