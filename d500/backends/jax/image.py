"""Image JAX ops: Resize/Upsample (the shared interpolation matrices, computed while tracing),
GridSample, Col2Im, ImageDecoder."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from d500.backends import host_ops, resize, sampling
from d500.backends.graph import registry
from d500.backends.jax.core import NotStatic, ints, static

OPS, op = registry()


# -- resizing: the shared per-axis matrices, applied as products (nearest as a gather) -----------
def _resize(node, x, how, scales, sizes=None, roi=None):
    floating = jnp.issubdtype(x.dtype, jnp.floating)
    compute = x.dtype if floating else jnp.float64
    y = x.astype(compute)
    for a, w, outside in resize.plan(x.shape, how, scales, sizes, roi, node.attr("axes")):
        if how["mode"] == "nearest":  # one tap per output: a gather, exact
            y = jnp.take(y, jnp.asarray(w.argmax(axis=1)), axis=a)
        else:
            y = jnp.moveaxis(jnp.tensordot(y, jnp.asarray(w.T, compute), axes=([a], [0]),
                                           precision="highest"), -1, a)
        if outside is not None:
            mask = jnp.asarray(outside).reshape([-1 if i == a else 1 for i in range(x.ndim)])
            y = jnp.where(mask, jnp.asarray(how["extrapolation_value"], compute), y)
    if not floating:
        info = jnp.iinfo(x.dtype)
        y = jnp.clip(jnp.round(y), info.min, info.max)
    return y.astype(x.dtype)


def _floats(x, what):
    if x is None or not x.size:
        return None
    value = static(x)
    if value is None:
        raise NotStatic(what, x)
    return [float(v) for v in value.reshape(-1)]


@op
def Resize(node, x, roi=None, scales=None, sizes=None):
    if node.opset < 11:
        scales, roi = roi, None
    sizes = ints(sizes, "sizes") if sizes is not None and sizes.size else None
    return _resize(node, x, resize.how(node), _floats(scales, "scales"), sizes,
                   _floats(roi, "roi"))


@op
def Upsample(node, x, scales=None):
    scales = node.attr("scales") if scales is None else _floats(scales, "scales")
    return _resize(node, x, resize.upsample_how(node), [float(s) for s in scales])


@op
def Col2Im(node, x, image_shape, block_shape):
    image, block = ints(image_shape, "image shape"), ints(block_shape, "block shape")
    n = len(image)
    flat, valid = resize.col2im(image, block, node.attr("dilations") or [1] * n,
                                node.attr("strides") or [1] * n, node.attr("pads") or [0] * (2 * n))
    batch, channels = x.shape[0], x.shape[1] // math.prod(block)
    cols = x.reshape(batch, channels, -1)[..., np.nonzero(valid)[0]]
    out = jnp.zeros((batch, channels, math.prod(image)), x.dtype)
    out = out.at[..., flat[valid]].add(cols)
    return out.reshape(batch, channels, *image)


@op
def ImageDecoder(node, encoded):
    data = static(encoded)
    if data is None:
        raise NotStatic("encoded image")
    return jnp.asarray(host_ops.decode_image(data.tobytes(), node.attr("pixel_format", "RGB")))


# -- sampling ------------------------------------------------------------------------------------
_KIT = sampling.Kit(
    floor=jnp.floor, round=jnp.round, where=jnp.where, clip=jnp.clip, mod=jnp.mod,
    ones_like=jnp.ones_like, true_like=lambda x: jnp.ones(x.shape, bool),
    index=lambda x: x.astype(jnp.int64))


@op
def GridSample(node, x, grid):
    return grid_sample(x, grid, sampling.mode(node), node.attr("padding_mode", "zeros"),
                       node.attr("align_corners", 0))


def grid_sample(x, grid, mode: str, padding: str, align: int):
    """Sample x at grid's normalized coordinates: nearest, (bi)linear or (bi)cubic, N-D."""
    xl = jnp.moveaxis(x, 1, -1)  # [N, *dims, C]
    taps = sampling.taps(_KIT, grid.astype(jnp.float64), list(x.shape[2:]), mode, padding,
                         align)
    batch = jnp.arange(x.shape[0]).reshape(-1, *[1] * (grid.ndim - 2))
    out = None
    for index, weight, valid in sampling.combinations(taps):
        values = xl[(batch, *index)]  # [N, *out, C]
        term = values * jnp.where(valid, weight, 0).astype(x.dtype)[..., None]
        out = term if out is None else out + term
    return jnp.moveaxis(out, -1, 1)
