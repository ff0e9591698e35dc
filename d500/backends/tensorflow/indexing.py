"""Indexing operators in TensorFlow: gathers, scatters, one-hot, masks, NonZero, Compress,
ReverseSequence, Unique."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from d500.backends import host_ops
from d500.backends.graph import registry
from d500.backends.tensorflow.core import ints, norm_axis, shape_list, static

OPS, op = registry()


@op
def Gather(node, x, indices):
    axis = norm_axis(node.attr("axis", 0), x.shape.rank)
    size = tf.shape(x, out_type=indices.dtype)[axis]
    indices = tf.where(indices < 0, indices + size, indices)
    return tf.gather(x, indices, axis=axis)


def _element_coords(node, x, indices):
    """Full coordinates of each element of GatherElements/ScatterElements: `indices` on `axis`."""
    axis = norm_axis(node.attr("axis", 0), x.shape.rank)
    size = tf.shape(x, out_type=indices.dtype)[axis]
    indices = tf.cast(tf.where(indices < 0, indices + size, indices), tf.int64)
    grids = tf.meshgrid(*[tf.range(d, dtype=tf.int64) for d in shape_list(indices)],
                        indexing="ij")
    grids[axis] = indices
    return tf.stack(grids, -1)


@op
def GatherElements(node, x, indices):
    return tf.gather_nd(x, _element_coords(node, x, indices))


@op
def GatherND(node, x, indices):
    b = node.attr("batch_dims", 0)
    shape = tf.shape(x, out_type=indices.dtype)
    k = indices.shape[-1]
    dims = shape[b:b + k]
    indices = tf.where(indices < 0, indices + dims, indices)
    return tf.gather_nd(x, indices, batch_dims=b)


def _scatter(x, idx, upd, reduction):
    if reduction in (None, "none"):
        return tf.tensor_scatter_nd_update(x, idx, upd)
    fn = {"add": tf.tensor_scatter_nd_add, "max": tf.tensor_scatter_nd_max,
          "min": tf.tensor_scatter_nd_min}.get(reduction)
    if fn is not None:
        return fn(x, idx, upd)
    if reduction == "mul":  # sequential product over (possibly repeated) indices
        n = idx.shape[0]
        for i in range(n):
            cur = tf.gather_nd(x, idx[i:i + 1])
            x = tf.tensor_scatter_nd_update(x, idx[i:i + 1], cur * upd[i:i + 1])
        return x
    raise ValueError(reduction)


@op
def ScatterND(node, x, indices, updates):
    indices = tf.cast(indices, tf.int64)
    shape = tf.shape(x, out_type=tf.int64)[:indices.shape[-1]]
    indices = tf.where(indices < 0, indices + shape, indices)
    reduction = node.attr("reduction", "none")
    if reduction == "mul":
        k = indices.shape[-1]
        flat_i = tf.reshape(indices, [-1, k])
        flat_u = tf.reshape(updates, [-1, *updates.shape[indices.shape.rank - 1:]])
        return _scatter(x, flat_i, flat_u, reduction)
    return _scatter(x, indices, updates, reduction)


@op(names=("ScatterElements", "Scatter"))  # Scatter (opset 9-10): ScatterElements, no reduction
def ScatterElements(node, x, indices, updates):
    idx = tf.reshape(_element_coords(node, x, indices), [-1, x.shape.rank])
    return _scatter(x, idx, tf.reshape(updates, [-1]), node.attr("reduction", "none"))


@op
def OneHot(node, indices, depth, values):
    axis = node.attr("axis", -1)
    axis = axis + indices.shape.rank + 1 if axis < 0 else axis
    d = int(np.asarray(static(depth)).reshape(-1)[0])
    idx = tf.cast(indices, tf.int64)
    idx = tf.where(idx < 0, idx + d, idx)
    return tf.one_hot(idx, d, on_value=values[1], off_value=values[0], axis=axis)


@op
def NonZero(node, x):
    return tf.transpose(tf.where(tf.cast(x, tf.bool) if x.dtype != tf.bool else x))


@op
def Trilu(node, x, k=None):
    k = 0 if k is None else ints(k, node, "k")[0]
    n, m = shape_list(x)[-2:]
    rows = tf.range(n, dtype=tf.int64)[:, tf.newaxis]
    cols = tf.range(m, dtype=tf.int64)[tf.newaxis, :]
    keep = cols - rows >= k if node.attr("upper", 1) else cols - rows <= k
    return tf.where(keep, x, tf.zeros_like(x))


@op
def Compress(node, x, condition):
    axis = node.attr("axis")
    cond = tf.cast(condition, tf.bool)
    if axis is None:
        x = tf.reshape(x, [-1])
        axis = 0
    axis = norm_axis(axis, x.shape.rank)
    n, m = x.shape[axis], cond.shape[0]
    if n is not None and m is not None:
        cond = cond[:n] if m > n else tf.concat([cond, tf.zeros([n - m], tf.bool)], 0)
    return tf.boolean_mask(x, cond, axis=axis)


@op
def ReverseSequence(node, x, lengths):
    return tf.reverse_sequence(x, lengths, seq_axis=node.attr("time_axis", 0),
                               batch_axis=node.attr("batch_axis", 1))


@op
def Unique(node, x):
    """Unique values (sorted unless sorted=0), first indices, inverse indices and counts."""
    axis, srt = node.attr("axis"), node.attr("sorted", 1)
    out = tf.numpy_function(lambda a: host_ops.unique(np.asarray(a), axis, srt), [x],
                            [x.dtype, tf.int64, tf.int64, tf.int64], stateful=False)
    return tuple(out)
