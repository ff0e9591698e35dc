"""Pooling operators in TensorFlow: max (with indices), average and Lp pooling, windowed and
global, through TensorFlow's channels-last kernels."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from d500.backends.graph import registry
from d500.backends.tensorflow.conv import rank_of, spatial_of
from d500.backends.tensorflow.core import ChannelsLast, plain, to_last
from d500.backends.windows import pool_geometry

OPS, op = registry()


def _pool_geometry(node, x):
    kernel, strides, dilations, begin, end, _, extra = pool_geometry(node, spatial_of(x))
    return (rank_of(x) - 2, kernel, strides, dilations, list(zip(begin, end)),
            [max(e, 0) for e in extra])


def _window_reduce(x, kernel, strides, dilations, kind):
    """Reduce windows of channels-last x (VALID); 'MAX' or 'AVG' (sum/count) in TF's kernels."""
    n = len(kernel)
    if n == 1:
        y = _window_reduce(x[:, tf.newaxis], [1, *kernel], [1, *strides], [1, *dilations],
                           kind)
        return y[:, 0]
    if any(d > 1 for d in dilations) or any(s > k for s, k in zip(strides, kernel)):
        y = tf.nn.pool(x, kernel, kind, strides=[1] * n, padding="VALID",
                       dilations=dilations)
        return y[(slice(None), *[slice(None, None, s) for s in strides])]
    return tf.nn.pool(x, kernel, kind, strides=strides, padding="VALID")


@op
def MaxPool(node, x):
    if len(node.outputs) > 1 and node.outputs[1]:
        x = plain(x)
    _, kernel, strides, dilations, pads, extra = _pool_geometry(node, x)
    xl = to_last(x)
    dtype = xl.dtype
    low = dtype.min if dtype.is_integer else -np.inf
    padding = [(0, 0)] + [(pb, pe + e) for (pb, pe), e in zip(pads, extra)] + [(0, 0)]
    if any(p != (0, 0) for p in padding):
        xl = tf.pad(xl, padding, constant_values=tf.constant(low, dtype))
    work = xl if dtype in (tf.float32, tf.float64, tf.float16) else tf.cast(xl, tf.float64)
    y = ChannelsLast(tf.cast(_window_reduce(work, kernel, strides, dilations, "MAX"), dtype))
    if len(node.outputs) > 1 and node.outputs[1]:
        y = y.nchw()
        return y, _argmax_indices(node, x, y, kernel, strides, dilations, pads, extra)
    return y


def _argmax_indices(node, x, y, kernel, strides, dilations, pads, extra):
    """Flat NCHW indices of each window's maximum (first occurrence), as ONNX MaxPool returns."""
    shape = x.shape.as_list()
    flat = np.arange(np.prod(shape), dtype=np.float64)  # indices into the whole tensor
    if node.attr("storage_order", 0):  # column-major spatial dimensions
        r = len(shape)
        flat = flat.reshape([shape[0] * shape[1], *shape[2:][::-1]]).transpose(
            [0, *range(r - 2, 0, -1)])
    idx = tf.reshape(tf.constant(flat), shape)
    low = np.inf
    padding = [(0, 0), (0, 0)] + [(pb, pe + e) for (pb, pe), e in zip(pads, extra)]
    xp = tf.pad(tf.cast(x, tf.float64), padding, constant_values=-np.inf)
    ip = tf.pad(idx, padding, constant_values=low)
    patches_x, patches_i = [], []
    out = y.shape.as_list()[2:]
    import itertools
    for offs in itertools.product(*[range(k) for k in kernel]):
        sl = tuple(slice(o * d, o * d + (m - 1) * s + 1, s)
                   for o, d, m, s in zip(offs, dilations, out, strides))
        patches_x.append(xp[(slice(None), slice(None), *sl)])
        patches_i.append(ip[(slice(None), slice(None), *sl)])
    px, pi = tf.stack(patches_x, -1), tf.stack(patches_i, -1)
    best = tf.argmax(px, -1)
    return tf.cast(tf.gather(pi, best, batch_dims=x.shape.rank), tf.int64)


@op
def AveragePool(node, x):
    _, kernel, strides, dilations, pads, extra = _pool_geometry(node, x)
    xl = to_last(x)
    padding = [(0, 0)] + [(pb, pe + e) for (pb, pe), e in zip(pads, extra)] + [(0, 0)]
    include = node.attr("count_include_pad", 0)
    if not any(p != (0, 0) for p in padding):
        return ChannelsLast(_window_reduce(xl, kernel, strides, dilations, "AVG"))
    xp = tf.pad(xl, padding)
    spatial = spatial_of(x)
    ones = np.zeros([1, *[s + pb + pe + e for s, (pb, pe), e in zip(spatial, pads, extra)], 1],
                    dtype=xl.dtype.as_numpy_dtype)
    if include:
        inner = tuple(slice(0, s + pb + pe) for s, (pb, pe) in zip(spatial, pads))
    else:
        inner = tuple(slice(pb, pb + s) for s, (pb, _) in zip(spatial, pads))
    ones[(0, *inner, 0)] = 1
    window = float(np.prod(kernel))
    sums = _window_reduce(xp, kernel, strides, dilations, "AVG") * window
    counts = _window_reduce(tf.constant(ones), kernel, strides, dilations, "AVG") * window
    return ChannelsLast(sums / counts)


@op
def LpPool(node, x):
    p = node.attr("p", 2)
    _, kernel, strides, dilations, pads, extra = _pool_geometry(node, x)
    padding = [(0, 0)] + [(pb, pe + e) for (pb, pe), e in zip(pads, extra)] + [(0, 0)]
    xl = tf.pad(tf.abs(to_last(x)) ** p, padding)
    s = _window_reduce(xl, kernel, strides, dilations, "AVG") * float(np.prod(kernel))
    return ChannelsLast(s ** (1.0 / p))


def _global(reduce, x):
    """`reduce` over the spatial axes, kept; a channels-last value stays channels-last."""
    if isinstance(x, ChannelsLast):
        return ChannelsLast(reduce(x.t, axis=list(range(1, x.t.shape.rank - 1)), keepdims=True))
    return reduce(x, axis=list(range(2, x.shape.rank)), keepdims=True)


@op
def GlobalAveragePool(node, x):
    return _global(tf.reduce_mean, x)


@op
def GlobalMaxPool(node, x):
    return _global(tf.reduce_max, x)


@op
def GlobalLpPool(node, x):
    p = node.attr("p", 2)
    return tf.reduce_sum(tf.abs(x) ** p, axis=list(range(2, x.shape.rank)),
                         keepdims=True) ** (1.0 / p)
