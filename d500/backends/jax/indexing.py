"""Indexing JAX ops: gathers, scatters, one-hot, masks, NonZero, Compress, ReverseSequence,
Unique, TensorScatter. Operators whose output shape depends on values (NonZero, Compress,
Unique) need those values while tracing: the executable bakes them."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from d500.backends import host_ops
from d500.backends.graph import registry
from d500.backends.jax.core import NotStatic, ints, norm_axis, static

OPS, op = registry()


def _positive(index, size):
    index = index.astype(jnp.int64)
    return jnp.where(index < 0, index + jnp.asarray(size, jnp.int64), index)


@op
def Gather(node, x, index):
    axis = norm_axis(node.attr("axis", 0), x.ndim)
    if isinstance(x, np.ndarray) and x.dtype.kind in "OUS":
        i = static(index)
        if i is None:
            raise NotStatic("index into a string tensor", index)
        return np.take(x, i, axis=axis)
    return jnp.take(x, _positive(index, x.shape[axis]), axis=axis, mode="clip")


@op
def GatherElements(node, x, index):
    axis = norm_axis(node.attr("axis", 0), x.ndim)
    return jnp.take_along_axis(x, _positive(index, x.shape[axis]), axis=axis, mode="clip")


@op
def GatherND(node, x, index):
    b = node.attr("batch_dims", 0)
    k = index.shape[-1]
    index = _positive(index, np.array(x.shape[b:b + k], np.int64))
    batch = math.prod(x.shape[:b])
    xb = x.reshape(batch, *x.shape[b:])
    ib = index.reshape(batch, *index.shape[b:])
    rows = jnp.arange(batch).reshape(batch, *[1] * (ib.ndim - 2))
    rows = jnp.broadcast_to(rows, ib.shape[:-1])
    picked = xb[(rows, *[ib[..., i] for i in range(k)])]
    return picked.reshape((*index.shape[:-1], *x.shape[b + k:]))


def _scatter(target, where, updates, reduction):
    at = target.at[where]
    if reduction == "none":
        return at.set(updates)
    return {"add": at.add, "mul": at.multiply, "max": at.max, "min": at.min}[reduction](updates)


@op(names=("ScatterElements", "Scatter"))  # Scatter (opset 9-10): ScatterElements, no reduction
def ScatterElements(node, x, index, updates):
    axis = norm_axis(node.attr("axis", 0), x.ndim)
    index = _positive(index, x.shape[axis])
    grids = list(jnp.meshgrid(*[jnp.arange(s) for s in index.shape], indexing="ij"))
    grids[axis] = index
    return _scatter(x, tuple(grids), updates, node.attr("reduction", "none"))


@op
def ScatterND(node, x, index, updates):
    k = index.shape[-1]
    index = _positive(index, np.array(x.shape[:k], np.int64))
    where = tuple(index[..., i] for i in range(k))
    return _scatter(x, where, updates, node.attr("reduction", "none"))


# -- other index-driven ops ------------------------------------------------------------------------
@op
def OneHot(node, indices, depth, values):
    depth = int(ints(depth, "depth")[0])
    rank = indices.ndim + 1
    axis = norm_axis(node.attr("axis", -1), rank)
    index = indices.astype(jnp.int64)
    index = jnp.expand_dims(jnp.where(index < 0, index + depth, index), axis)
    shape = [1] * rank
    shape[axis] = depth
    hot = index == jnp.arange(depth, dtype=jnp.int64).reshape(shape)
    return jnp.where(hot, values[1], values[0])


def _value(x, what):
    value = static(x)
    if value is None:
        raise NotStatic(what, x)
    return value


@op
def NonZero(node, x):
    value = _value(x, "input (its nonzero count decides the output shape)")
    return jnp.asarray(np.array(np.nonzero(value if value.ndim else value.reshape(1)),
                                dtype=np.int64).reshape(value.ndim, -1))


@op
def Trilu(node, x, k=None):
    k = 0 if k is None else ints(k, "k")[0]
    return jnp.triu(x, k) if node.attr("upper", 1) else jnp.tril(x, k)


@op
def Compress(node, x, condition):
    axis = node.attr("axis")
    if axis is None:
        x, axis = x.reshape(-1), 0
    picks = np.nonzero(_value(condition, "condition").reshape(-1))[0]
    return jnp.take(x, jnp.asarray(picks, jnp.int64), axis=norm_axis(axis, x.ndim))


@op
def ReverseSequence(node, x, lengths):
    batch_axis, time_axis = node.attr("batch_axis", 1), node.attr("time_axis", 0)
    steps = x.shape[time_axis]
    t = jnp.arange(steps).reshape([-1 if i == time_axis else 1 for i in range(x.ndim)])
    n = lengths.astype(jnp.int64).reshape([-1 if i == batch_axis else 1 for i in range(x.ndim)])
    source = jnp.where(t < n, n - 1 - t, t)
    source = jnp.broadcast_to(source, x.shape)
    return jnp.take_along_axis(x, source, axis=time_axis)


@op
def Unique(node, x):
    return tuple(jnp.asarray(v) for v in host_ops.unique(
        _value(x, "input of Unique"), node.attr("axis"), node.attr("sorted", 1)))


@op
def TensorScatter(node, cache, update, write_indices=None):
    axis = norm_axis(node.attr("axis", -2), cache.ndim)
    size, length = cache.shape[axis], update.shape[axis]
    starts = (write_indices.astype(jnp.int64) if write_indices is not None
              else jnp.zeros(cache.shape[0], jnp.int64))
    where = starts.reshape(-1, 1) + jnp.arange(length)
    if node.attr("mode", "linear") == "circular":
        where = where % size
    moved = jnp.moveaxis(cache, axis, 1)
    upd = jnp.moveaxis(update, axis, 1)
    rows = jnp.arange(cache.shape[0]).reshape(-1, 1)
    return jnp.moveaxis(moved.at[rows, where].set(upd), 1, axis)
