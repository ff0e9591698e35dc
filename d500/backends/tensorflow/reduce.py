"""Reductions and order statistics in TensorFlow: Reduce* (axes as attribute or input),
ArgMax/ArgMin, TopK."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from d500.backends.graph import registry
from d500.backends.tensorflow.core import ints, norm_axes, norm_axis

OPS, op = registry()

_NO_KERNEL = (tf.uint16, tf.uint32, tf.uint64, tf.int8, tf.int16)


def _axes(node, x, axes):
    if axes is not None:
        axes = ints(axes, node, "axes")
    else:
        axes = node.attr("axes")
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            return None
        return list(range(x.shape.rank))
    return norm_axes(axes, x.shape.rank)


def _reduce(fn):
    def run(node, x, axes=None):
        ax = _axes(node, x, axes)
        if ax is None:
            return x
        keep = bool(node.attr("keepdims", 1))
        if x.dtype == tf.bool and fn in _BOOLEAN:
            return _BOOLEAN[fn](x, ax, keepdims=keep)
        if x.dtype == tf.bool:
            return tf.cast(fn(tf.cast(x, tf.int32), ax, keep), tf.bool)
        if x.dtype in _NO_KERNEL:
            return tf.cast(fn(tf.cast(x, tf.int64), ax, keep), x.dtype)
        return fn(x, ax, keep)
    return run


def _logsumexp(x, axes, keep):
    m = tf.stop_gradient(tf.reduce_max(x, axes, keepdims=True))
    m = tf.where(tf.math.is_finite(m), m, tf.zeros_like(m))
    y = tf.math.log(tf.reduce_sum(tf.exp(x - m), axes, keepdims=True)) + m
    return y if keep else tf.squeeze(y, axes)


def _max(x, a, k):
    return tf.reduce_max(x, a, keepdims=k)


def _min(x, a, k):
    return tf.reduce_min(x, a, keepdims=k)


_BOOLEAN = {_max: tf.reduce_any, _min: tf.reduce_all}
for _name, _fn in {
    "ReduceSum": lambda x, a, k: tf.reduce_sum(x, a, keepdims=k),
    "ReduceMean": lambda x, a, k: tf.reduce_mean(x, a, keepdims=k),
    "ReduceMax": _max,
    "ReduceMin": _min,
    "ReduceProd": lambda x, a, k: tf.reduce_prod(x, a, keepdims=k),
    "ReduceL1": lambda x, a, k: tf.reduce_sum(tf.abs(x), a, keepdims=k),
    "ReduceL2": lambda x, a, k: tf.cast(tf.sqrt(tf.reduce_sum(
        tf.square(tf.cast(x, tf.float64) if x.dtype.is_integer else x), a, keepdims=k)),
        x.dtype),
    "ReduceSumSquare": lambda x, a, k: tf.reduce_sum(tf.square(x), a, keepdims=k),
    "ReduceLogSum": lambda x, a, k: tf.math.log(tf.reduce_sum(x, a, keepdims=k)),
    "ReduceLogSumExp": _logsumexp,
}.items():
    op(_reduce(_fn), names=(_name,))


def _arg(fn, node, x):
    axis = norm_axis(node.attr("axis", 0), x.shape.rank)
    if x.dtype == tf.bool:
        x = tf.cast(x, tf.int8)
    if node.attr("select_last_index", 0):
        n = tf.shape(x, out_type=tf.int64)[axis]
        y = n - 1 - fn(tf.reverse(x, [axis]), axis=axis, output_type=tf.int64)
    else:
        y = fn(x, axis=axis, output_type=tf.int64)
    return tf.expand_dims(y, axis) if node.attr("keepdims", 1) else y


@op
def ArgMax(node, x):
    return _arg(tf.argmax, node, x)


@op
def ArgMin(node, x):
    return _arg(tf.argmin, node, x)


@op
def TopK(node, x, k):
    axis = norm_axis(node.attr("axis", -1), x.shape.rank)
    k = ints(k, node, "k")[0] if node.opset >= 10 else node.attr("k")
    largest = node.attr("largest", 1)
    r = x.shape.rank
    perm = [i for i in range(r) if i != axis] + [axis]
    inv = np.argsort(perm).tolist()
    t = tf.transpose(x, perm)
    # stable order: ties keep the smaller index first, as ONNX
    idx = tf.argsort(t, axis=-1, direction="DESCENDING" if largest else "ASCENDING",
                     stable=True)[..., :k]
    vals = tf.gather(t, idx, batch_dims=r - 1)
    return tf.transpose(vals, inv), tf.cast(tf.transpose(idx, inv), tf.int64)
