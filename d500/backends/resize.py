"""Resize, Upsample and Col2Im index arithmetic in NumPy, shared by the backends that apply it.

Resize is separable and linear in its input: along each resized axis it is a product with an
(out x in) matrix computed here once per shape, so a backend only multiplies, masks and rounds.
"""

from __future__ import annotations

import math

import numpy as np


# -- interpolation coefficients, one row per output position (ratio in (0, 1]) -------------------
def _nearest(ratio, scale, mode):
    exact = ratio == 1.0
    if mode == "round_prefer_ceil":
        right = ratio >= 0.5
    elif mode == "floor":
        right = np.zeros_like(ratio, dtype=bool)
    elif mode == "ceil":
        right = np.ones_like(ratio, dtype=bool)
    else:  # round_prefer_floor
        right = ratio > 0.5
    right = right | exact
    return np.stack([~right, right], axis=1).astype(np.float64)


def _linear(ratio, scale, antialias):
    if not antialias or scale >= 1:
        return np.stack([1 - ratio, ratio], axis=1)
    start = math.floor(-1 / scale) + 1
    taps = np.arange(start, 2 - start)
    coeffs = np.clip(1 - np.abs((taps[None, :] - ratio[:, None]) * scale), 0, 1)
    return coeffs / coeffs.sum(axis=1, keepdims=True)


def _cubic_kernel(x, a):
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x <= 1, near, np.where(x < 2, far, 0.0))


def _cubic(ratio, scale, antialias, a):
    if not antialias or scale >= 1:
        taps = np.array([-1, 0, 1, 2])
        return _cubic_kernel(taps[None, :] - ratio[:, None], a)
    start = math.floor(-2 / scale) + 1
    taps = np.arange(start, 2 - start)
    coeffs = _cubic_kernel((taps[None, :] - ratio[:, None]) * scale, a)
    return coeffs / coeffs.sum(axis=1, keepdims=True)


def _source_coords(mode, out_size, in_size, scale, roi):
    y = np.arange(out_size, dtype=np.float64)
    width = scale * in_size
    if mode == "align_corners":
        return np.zeros(out_size) if width == 1 else y * (in_size - 1) / (width - 1)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_crop_and_resize":
        if width == 1:
            x = np.full(out_size, (roi[1] - roi[0]) * (in_size - 1) / 2)
        else:
            x = y * (roi[1] - roi[0]) * (in_size - 1) / (width - 1)
        return x + roi[0] * (in_size - 1)
    if mode == "pytorch_half_pixel":
        return np.full(out_size, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = in_size / 2 * (1 - out_size / width)
        return offset + (y + 0.5) / scale - 0.5
    return (y + 0.5) / scale - 0.5  # half_pixel


def interpolation_matrix(in_size: int, out_size: int, scale: float, how: dict,
                         roi=None) -> tuple[np.ndarray, np.ndarray | None]:
    """(W, outside): out = W @ in along one axis; `outside` marks extrapolated positions."""
    x = _source_coords(how["coordinate_transformation_mode"], out_size, in_size, scale, roi)
    base = np.floor(x)
    ratio = np.where(x == base, 1.0, x - base)
    mode = how["mode"]
    if mode == "nearest":
        coeffs = _nearest(ratio, scale, how["nearest_mode"])
    elif mode == "linear":
        coeffs = _linear(ratio, scale, how["antialias"])
    else:
        coeffs = _cubic(ratio, scale, how["antialias"], how["cubic_coeff_a"])
    n = coeffs.shape[1]
    pad = math.ceil(n / 2)
    xp = x + pad
    p = np.floor(xp).astype(np.int64)
    frac = xp - p
    if n % 2 == 0:
        offset = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        offset = np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    taps = (p + offset)[:, None] + np.arange(n)[None, :] - pad
    if how["exclude_outside"]:
        coeffs = np.where((taps < 0) | (taps >= in_size), 0.0, coeffs)
        total = coeffs.sum(axis=1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    w = np.zeros((out_size, in_size))
    rows = np.repeat(np.arange(out_size), n)
    np.add.at(w, (rows, np.clip(taps, 0, in_size - 1).reshape(-1)), coeffs.reshape(-1))
    outside = None
    if how["coordinate_transformation_mode"] == "tf_crop_and_resize":
        outside = (x < 0) | (x > in_size - 1)
    return w, outside


def how(node) -> dict:
    """Resize's attributes with its opset's defaults (Resize-10 had asymmetric coordinates)."""
    old = node.opset < 11
    return {
        "mode": node.attr("mode", "nearest"),
        "coordinate_transformation_mode": node.attr(
            "coordinate_transformation_mode", "asymmetric" if old else "half_pixel"),
        "nearest_mode": node.attr("nearest_mode", "floor" if old else "round_prefer_floor"),
        "cubic_coeff_a": node.attr("cubic_coeff_a", -0.75),
        "exclude_outside": node.attr("exclude_outside", 0),
        "extrapolation_value": node.attr("extrapolation_value", 0.0),
        "antialias": node.attr("antialias", 0),
        "keep_aspect_ratio_policy": node.attr("keep_aspect_ratio_policy", "stretch"),
    }


def upsample_how(node) -> dict:
    """Upsample's (opset 7-9) fixed behaviour: asymmetric coordinates, floor for nearest."""
    mode = node.attr("mode", "nearest")
    return {"mode": "linear" if mode in ("linear", "bilinear") else mode,
            "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor",
            "cubic_coeff_a": -0.75, "exclude_outside": 0, "extrapolation_value": 0.0,
            "antialias": 0, "keep_aspect_ratio_policy": "stretch"}


def plan(shape, how: dict, scales=None, sizes=None, roi=None, axes=None):
    """[(axis, W, outside)] for an input of `shape`: out = W @ in along each axis that changes;
    `outside` (or None) marks output positions that take `how["extrapolation_value"]`."""
    rank = len(shape)
    axes = [a + rank if a < 0 else a for a in axes] if axes else list(range(rank))
    if sizes is not None:
        sizes = dict(zip(axes, sizes))
        scales = {a: sizes[a] / shape[a] for a in axes}
        policy = how["keep_aspect_ratio_policy"]
        if policy != "stretch":
            scale = (min if policy == "not_larger" else max)(scales.values())
            scales = {a: scale for a in axes}
            sizes = {a: int(scale * shape[a] + 0.5) for a in axes}
    else:
        scales = dict(zip(axes, scales))
        sizes = {a: int(scales[a] * shape[a]) for a in axes}
    if roi is not None and len(roi) == 2 * len(axes) and len(axes) != rank:
        roi = {a: (roi[i], roi[len(axes) + i]) for i, a in enumerate(axes)}
    elif roi is not None and len(roi) == 2 * rank:
        roi = {a: (roi[a], roi[rank + a]) for a in range(rank)}
    else:
        roi = {}
    steps = []
    for a in axes:
        r = roi.get(a, (0.0, 1.0))
        if math.isclose(scales[a], 1.0) and sizes[a] == shape[a] and r == (0.0, 1.0):
            continue
        w, outside = interpolation_matrix(shape[a], sizes[a], scales[a], how, r)
        steps.append((a, w, outside if outside is not None and outside.any() else None))
    return steps


def col2im(image, block, dilations, strides, pads):
    """(flat, valid): the flat image position that each (kernel offset, block position) column
    entry adds to, and whether it lies inside the image (padding does not)."""
    n = len(image)
    counts = [(size + pads[i] + pads[i + n] - (k - 1) * d - 1) // s + 1
              for i, (size, k, d, s) in enumerate(zip(image, block, dilations, strides))]
    flat = np.zeros((), np.int64)
    valid = np.ones((), bool)
    for i in range(n):
        pos = (np.arange(block[i]) * dilations[i])[:, None] + (
            np.arange(counts[i]) * strides[i] - pads[i])[None, :]
        shape = [1] * (2 * n)
        shape[i], shape[n + i] = block[i], counts[i]
        pos = pos.reshape(shape)
        flat = flat * image[i] + pos
        valid = valid & (pos >= 0) & (pos < image[i])
    return flat.reshape(-1), valid.reshape(-1)
