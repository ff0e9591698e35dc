"""Image JAX ops: Resize/Upsample (separable interpolation matrices, computed in NumPy while
tracing, as the torch backend's), GridSample, Col2Im, ImageDecoder."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from d500.backends.graph import registry
from d500.backends.jax.core import NotStatic, ints, norm_axis, static

OPS, op = registry()


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


def _resize(x, scales, sizes, roi, axes, how):
    rank = x.ndim
    axes = [norm_axis(a, rank) for a in axes] if axes else list(range(rank))
    if sizes is not None:
        sizes = dict(zip(axes, sizes))
        scales = {a: sizes[a] / x.shape[a] for a in axes}
        policy = how["keep_aspect_ratio_policy"]
        if policy != "stretch":
            scale = (min if policy == "not_larger" else max)(scales.values())
            scales = {a: scale for a in axes}
            sizes = {a: int(scale * x.shape[a] + 0.5) for a in axes}
    else:
        scales = dict(zip(axes, scales))
        sizes = {a: int(scales[a] * x.shape[a]) for a in axes}
    if roi is not None and len(roi) == 2 * len(axes) and len(axes) != rank:
        roi = {a: (roi[i], roi[len(axes) + i]) for i, a in enumerate(axes)}
    elif roi is not None and len(roi) == 2 * rank:
        roi = {a: (roi[a], roi[rank + a]) for a in range(rank)}
    else:
        roi = {}
    floating = jnp.issubdtype(x.dtype, jnp.floating)
    compute = x.dtype if floating else jnp.float64
    y = x.astype(compute)
    for a in axes:
        r = roi.get(a, (0.0, 1.0))
        if math.isclose(scales[a], 1.0) and sizes[a] == y.shape[a] and r == (0.0, 1.0):
            continue
        w, outside = interpolation_matrix(y.shape[a], sizes[a], scales[a], how, r)
        if how["mode"] == "nearest":  # one tap per output: a gather, exact
            y = jnp.take(y, jnp.asarray(w.argmax(axis=1)), axis=a)
        else:
            y = jnp.moveaxis(jnp.tensordot(y, jnp.asarray(w.T, compute), axes=([a], [0]),
                                           precision="highest"), -1, a)
        if outside is not None and outside.any():
            mask = jnp.asarray(outside).reshape([-1 if i == a else 1 for i in range(rank)])
            y = jnp.where(mask, jnp.asarray(how["extrapolation_value"], compute), y)
    if not floating:
        info = jnp.iinfo(x.dtype)
        y = jnp.clip(jnp.round(y), info.min, info.max)
    return y.astype(x.dtype)


def _floats(x, what):
    value = static(x)
    if value is None:
        raise NotStatic(what, x)
    return [float(v) for v in value.reshape(-1)]


@op
def Resize(node, x, roi=None, scales=None, sizes=None):
    if node.opset < 11:
        scales, roi = roi, None
        default_coords, default_nearest = "asymmetric", "floor"
    else:
        default_coords, default_nearest = "half_pixel", "round_prefer_floor"
    how = {
        "mode": node.attr("mode", "nearest"),
        "coordinate_transformation_mode": node.attr("coordinate_transformation_mode",
                                                    default_coords),
        "nearest_mode": node.attr("nearest_mode", default_nearest),
        "cubic_coeff_a": node.attr("cubic_coeff_a", -0.75),
        "exclude_outside": node.attr("exclude_outside", 0),
        "extrapolation_value": node.attr("extrapolation_value", 0.0),
        "antialias": node.attr("antialias", 0),
        "keep_aspect_ratio_policy": node.attr("keep_aspect_ratio_policy", "stretch"),
    }
    scales = _floats(scales, "scales") if scales is not None and scales.size else None
    sizes = ints(sizes, "sizes") if sizes is not None and sizes.size else None
    roi = _floats(roi, "roi") if roi is not None and roi.size else None
    return _resize(x, scales, sizes, roi, node.attr("axes"), how)


@op
def Upsample(node, x, scales=None):
    scales = node.attr("scales") if scales is None else _floats(scales, "scales")
    how = {"mode": node.attr("mode", "nearest"), "coordinate_transformation_mode": "asymmetric",
           "nearest_mode": "floor", "cubic_coeff_a": -0.75, "exclude_outside": 0,
           "extrapolation_value": 0.0, "antialias": 0, "keep_aspect_ratio_policy": "stretch"}
    return _resize(x, [float(s) for s in scales], None, None, None, how)


@op
def Col2Im(node, x, image_shape, block_shape):
    image, block = ints(image_shape, "image shape"), ints(block_shape, "block shape")
    n = len(image)
    dilations = node.attr("dilations") or [1] * n
    strides = node.attr("strides") or [1] * n
    pads = node.attr("pads") or [0] * (2 * n)
    counts = [(size + pads[i] + pads[i + n] - (k - 1) * d - 1) // s + 1
              for i, (size, k, d, s) in enumerate(zip(image, block, dilations, strides))]
    flat = np.zeros((), np.int64)
    valid = np.ones((), bool)
    for i in range(n):
        pos = (np.arange(block[i]) * dilations[i])[:, None] + (
            np.arange(counts[i]) * strides[i] - pads[i])[None, :]
        shape_k = [1] * (2 * n)
        shape_k[i], shape_k[n + i] = block[i], counts[i]
        pos = pos.reshape(shape_k)
        flat = flat * image[i] + pos
        valid = valid & (pos >= 0) & (pos < image[i])
    flat, valid = flat.reshape(-1), valid.reshape(-1)
    batch, channels = x.shape[0], x.shape[1] // math.prod(block)
    cols = x.reshape(batch, channels, -1)[..., np.nonzero(valid)[0]]
    out = jnp.zeros((batch, channels, math.prod(image)), x.dtype)
    out = out.at[..., flat[valid]].add(cols)
    return out.reshape(batch, channels, *image)


@op
def ImageDecoder(node, encoded):
    import io

    import PIL.Image
    data = static(encoded)
    if data is None:
        raise NotStatic("encoded image")
    image = PIL.Image.open(io.BytesIO(data.tobytes()))
    pixel_format = node.attr("pixel_format", "RGB")
    if pixel_format == "Grayscale":
        pixels = np.expand_dims(np.array(image.convert("L")), 2)
    else:
        pixels = np.array(image.convert("RGB"))
        if pixel_format == "BGR":
            pixels = pixels[:, :, ::-1]
    return jnp.asarray(np.ascontiguousarray(pixels))


# -- sampling ------------------------------------------------------------------------------------
def _reflect(x, lo, hi):
    """Reflect coordinates by the near border until they are inside [lo, hi] (ONNX GridSample)."""
    span = hi - lo
    below, above = lo - x, x - hi
    nb, na = jnp.floor(below / span), jnp.floor(above / span)
    rb, ra = below - nb * span, above - na * span
    low = jnp.where(jnp.mod(nb, 2) == 0, lo + rb, hi - rb)
    high = jnp.where(jnp.mod(na, 2) == 0, hi - ra, lo + ra)
    return jnp.where(x < lo, low, jnp.where(x > hi, high, x))


def _cubic_taps(t):
    a = -0.75
    t1, t2, t3 = t + 1, 1 - t, 2 - t
    return [((a * t1 - 5 * a) * t1 + 8 * a) * t1 - 4 * a,
            ((a + 2) * t - (a + 3)) * t * t + 1,
            ((a + 2) * t2 - (a + 3)) * t2 * t2 + 1,
            ((a * t3 - 5 * a) * t3 + 8 * a) * t3 - 4 * a]


@op
def GridSample(node, x, grid):
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(node.attr("mode", "linear"),
                                                         node.attr("mode", "linear"))
    return grid_sample(x, grid, mode, node.attr("padding_mode", "zeros"),
                       node.attr("align_corners", 0))


def grid_sample(x, grid, mode: str, padding: str, align: int):
    """Sample x at grid's normalized coordinates: nearest, (bi)linear or (bi)cubic, N-D."""
    import itertools
    dims = list(x.shape[2:])
    r = len(dims)
    xl = jnp.moveaxis(x, 1, -1)  # [N, *dims, C]
    g = grid.astype(jnp.float64)
    taps_per_dim = []
    for i, d in enumerate(dims):
        n = g[..., r - 1 - i]
        c = (n + 1) / 2 * (d - 1) if align else ((n + 1) * d - 1) / 2
        lo, hi = (0.0, d - 1.0) if align else (-0.5, d - 0.5)
        if mode == "nearest":
            c = jnp.round(c)
        if padding == "border":
            c = jnp.where((c < lo) | (c > hi), jnp.clip(c, 0.0, d - 1.0), c)
        elif padding == "reflection":
            c = _reflect(c, lo, hi)
        if mode == "nearest":
            taps = [(c, jnp.ones_like(c))]
        else:
            base = jnp.floor(c)
            t = c - base
            if mode == "linear":
                taps = [(base, 1 - t), (base + 1, t)]
            else:
                taps = list(zip([base - 1, base, base + 1, base + 2], _cubic_taps(t)))
        fixed = []
        for idx, w in taps:  # where each tap reads, by the padding rule
            if padding == "border":
                valid, idx = jnp.ones(idx.shape, bool), jnp.clip(idx, 0.0, d - 1.0)
            elif padding == "reflection":
                valid, idx = jnp.ones(idx.shape, bool), _reflect(idx, lo, hi)
            else:
                valid = (idx >= 0) & (idx <= d - 1)
                idx = jnp.clip(idx, 0.0, d - 1.0)
            fixed.append((idx.astype(jnp.int64), w, valid))
        taps_per_dim.append(fixed)
    batch = jnp.arange(x.shape[0]).reshape(-1, *[1] * (grid.ndim - 2))
    out = None
    for combo in itertools.product(*taps_per_dim):
        weight, valid = combo[0][1], combo[0][2]
        for c in combo[1:]:
            weight, valid = weight * c[1], valid & c[2]
        values = xl[(batch, *[c[0] for c in combo])]  # [N, *out, C]
        term = values * jnp.where(valid, weight, 0).astype(x.dtype)[..., None]
        out = term if out is None else out + term
    return jnp.moveaxis(out, -1, 1)
