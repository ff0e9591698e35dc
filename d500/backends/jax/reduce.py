"""Reductions and order statistics in JAX: Reduce*, ArgMax/ArgMin, TopK, CumSum/CumProd."""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from d500.backends.graph import registry
from d500.backends.jax.core import ints, norm_axis

OPS, op = registry()


def _reduce(node, x, axes, fn, empty_fill):
    """Reduce `x` over the node's axes with `fn(x, axes, keepdims)`; ONNX's rules for axes."""
    axes = node.attr("axes") if axes is None else ints(axes, "axes")
    keep = bool(node.attr("keepdims", 1))
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            return x
        axes = list(range(x.ndim))
    dims = tuple(sorted(norm_axis(a, x.ndim) for a in axes))
    if any(x.shape[d] == 0 for d in dims):
        shape = [1 if i in dims else s for i, s in enumerate(x.shape)] if keep else [
            s for i, s in enumerate(x.shape) if i not in dims]
        return jnp.full(shape, empty_fill(x.dtype), dtype=x.dtype)
    return fn(x, dims, keep)


def _lowest(dtype):
    if jnp.issubdtype(dtype, jnp.floating):
        return -math.inf
    return False if dtype == jnp.bool_ else jnp.iinfo(dtype).min


def _highest(dtype):
    if jnp.issubdtype(dtype, jnp.floating):
        return math.inf
    return True if dtype == jnp.bool_ else jnp.iinfo(dtype).max


def _as_float(fn):
    """Run a float-only reduction on an integer tensor in float64, cast back."""
    def run(x, axes, keep):
        if jnp.issubdtype(x.dtype, jnp.floating):
            return fn(x, axes, keep)
        return fn(x.astype(jnp.float64), axes, keep).astype(x.dtype)
    return run


def _same(fn):
    return lambda x, a, k: fn(x, axis=a, keepdims=k).astype(x.dtype)


@op
def ReduceSum(node, x, axes=None):
    return _reduce(node, x, axes, _same(jnp.sum), lambda dt: 0)


@op
def ReduceMean(node, x, axes=None):
    return _reduce(node, x, axes, _as_float(_same(jnp.mean)), lambda dt: math.nan)


@op
def ReduceMax(node, x, axes=None):
    return _reduce(node, x, axes, _same(jnp.max), _lowest)


@op
def ReduceMin(node, x, axes=None):
    return _reduce(node, x, axes, _same(jnp.min), _highest)


@op
def ReduceProd(node, x, axes=None):
    return _reduce(node, x, axes, _same(jnp.prod), lambda dt: 1)


@op
def ReduceL1(node, x, axes=None):
    return _reduce(node, x, axes, lambda t, a, k: jnp.sum(jnp.abs(t), axis=a, keepdims=k)
                   .astype(t.dtype), lambda dt: 0)


@op
def ReduceL2(node, x, axes=None):
    return _reduce(node, x, axes, _as_float(
        lambda t, a, k: jnp.sqrt(jnp.sum(jnp.square(t), axis=a, keepdims=k))), lambda dt: 0)


@op
def ReduceSumSquare(node, x, axes=None):
    return _reduce(node, x, axes, lambda t, a, k: jnp.sum(jnp.square(t), axis=a, keepdims=k)
                   .astype(t.dtype), lambda dt: 0)


@op
def ReduceLogSum(node, x, axes=None):
    return _reduce(node, x, axes, _as_float(
        lambda t, a, k: jnp.log(jnp.sum(t, axis=a, keepdims=k))), lambda dt: -math.inf)


@op
def ReduceLogSumExp(node, x, axes=None):
    from jax.scipy.special import logsumexp
    return _reduce(node, x, axes, _as_float(lambda t, a, k: logsumexp(t, axis=a, keepdims=k)),
                   lambda dt: -math.inf)


def _arg(node, x, pick):
    axis = norm_axis(node.attr("axis", 0), x.ndim)
    keep = bool(node.attr("keepdims", 1))
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    if node.attr("select_last_index", 0):
        y = x.shape[axis] - 1 - pick(jnp.flip(x, axis), axis=axis, keepdims=keep)
    else:
        y = pick(x, axis=axis, keepdims=keep)
    return y.astype(jnp.int64)


@op
def ArgMax(node, x):
    return _arg(node, x, jnp.argmax)


@op
def ArgMin(node, x):
    return _arg(node, x, jnp.argmin)


@op
def TopK(node, x, k=None):
    k = node.attr("k") if k is None else ints(k, "k")[0]
    axis = norm_axis(node.attr("axis", -1), x.ndim)
    largest = bool(node.attr("largest", 1))
    index = jnp.argsort(x, axis=axis, stable=True, descending=largest)
    index = lax.slice_in_dim(index, 0, k, axis=axis)
    return jnp.take_along_axis(x, index, axis=axis), index.astype(jnp.int64)


def _cumulative(node, x, axis, fn, identity):
    axis = norm_axis(ints(axis, "axis")[0], x.ndim)
    reverse, exclusive = node.attr("reverse", 0), node.attr("exclusive", 0)
    if reverse:
        x = jnp.flip(x, axis)
    if exclusive:
        pad = jnp.full_like(lax.slice_in_dim(x, 0, 1, axis=axis), identity)
        x = jnp.concatenate([pad, lax.slice_in_dim(x, 0, x.shape[axis] - 1, axis=axis)], axis)
    y = fn(x, axis=axis).astype(x.dtype)
    return jnp.flip(y, axis) if reverse else y


@op
def CumSum(node, x, axis):
    return _cumulative(node, x, axis, jnp.cumsum, 0)


@op
def CumProd(node, x, axis):
    return _cumulative(node, x, axis, jnp.cumprod, 1)
