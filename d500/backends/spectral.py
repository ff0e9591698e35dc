"""Signal-processing arithmetic in Python and NumPy, shared by the backends that apply it: a DFT
node's axis and length, and the mel filter bank of MelWeightMatrix (a constant of the trace)."""

from __future__ import annotations

import math

import numpy as np


def dft_plan(node, shape, axis: int | None, dft_length: int | None
             ) -> tuple[int, int, bool, bool]:
    """(axis, length, inverse, onesided) of a DFT node over an input of `shape`, given its axis
    and dft_length inputs as ints (None where absent)."""
    if node.opset < 20:
        axis = node.attr("axis", 1)
    elif axis is None:
        axis = -2
    axis = axis + len(shape) if axis < 0 else axis
    inverse, onesided = bool(node.attr("inverse", 0)), bool(node.attr("onesided", 0))
    if dft_length is not None:
        n = dft_length
    else:
        n = 2 * (shape[axis] - 1) if inverse and onesided else shape[axis]
    return axis, n, inverse, onesided


def mel_weight_matrix(bins: int, n: int, rate: int, low: float, high: float) -> np.ndarray:
    """The [n // 2 + 1, bins] triangular mel filters from `low` to `high` Hz, in float64."""
    low_mel = 2595 * math.log1p(low / 700) / math.log(10)
    high_mel = 2595 * math.log1p(high / 700) / math.log(10)
    points = np.arange(bins + 2) * (high_mel - low_mel) / (bins + 2) + low_mel
    points = 700 * np.expm1(points / 2595 * math.log(10))
    points = (((n + 1) * points) // rate).astype(int)
    out = np.zeros((n // 2 + 1, bins))
    for i in range(bins):
        left, center, right = points[i:i + 3]
        if center == left:
            out[center, i] = 1
        else:
            j = np.arange(left, center + 1)
            out[j, i] = (j - left) / (center - left)
        if right > center:
            j = np.arange(center, right)
            out[j, i] = (right - j) / (right - center)
    return out
