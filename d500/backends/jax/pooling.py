"""Pooling JAX ops: max, average and Lp pooling (windowed and global), MaxUnpool."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from d500.backends.graph import registry
from d500.backends.jax.core import ChannelsLast, ints
from d500.backends.windows import pool_geometry, unpool_shape

OPS, op = registry()


def _window(x, init, fn, kernel, strides, dilations, begin, end):
    """reduce_window over the spatial axes with explicit (possibly negative) padding."""
    pad = [(0, 0), (0, 0), *zip(begin, end)]
    return lax.reduce_window(x, init, fn, (1, 1, *kernel), (1, 1, *strides), pad,
                             window_dilation=(1, 1, *dilations))


def _lowest(x):
    if jnp.issubdtype(x.dtype, jnp.floating):
        return jnp.array(-jnp.inf, x.dtype)
    return jnp.array(jnp.iinfo(x.dtype).min, x.dtype)


@op
def MaxPool(node, x):
    kernel, strides, dilations, begin, end, _, extra = pool_geometry(node, x.shape[2:])
    end = [e + max(m, 0) for e, m in zip(end, extra)]
    if not (len(node.outputs) > 1 and node.outputs[1]):
        return _window(x, _lowest(x), lax.max, kernel, strides, dilations, begin, end)
    spatial = x.shape[2:]
    plane = math.prod(spatial)
    if node.attr("storage_order", 0) == 1:  # column-major positions within a plane
        index = np.arange(plane).reshape(spatial[::-1]).T
    else:
        index = np.arange(plane).reshape(spatial)
    index = index + (np.arange(x.shape[0] * x.shape[1]) * plane).reshape(
        x.shape[0], x.shape[1], *[1] * len(spatial))
    index = jnp.asarray(index, jnp.int64)

    def pick(a, b):
        (av, ai), (bv, bi) = a, b
        take_b = (bv > av) | ((bv == av) & (bi < ai))
        return jnp.where(take_b, bv, av), jnp.where(take_b, bi, ai)

    pad = [(0, 0), (0, 0), *zip(begin, end)]
    y, idx = lax.reduce_window(
        (x, index), (_lowest(x), jnp.array(np.iinfo(np.int64).max, jnp.int64)), pick,
        (1, 1, *kernel), (1, 1, *strides), pad, window_dilation=(1, 1, *dilations))
    return y, idx


def _counts(shape, kernel, strides, dilations, begin, end, include_pad, out_shape):
    """How many taps of each window land on counted positions (inside the input, or inside its
    explicit padding with count_include_pad), computed per axis in NumPy and multiplied: the
    divisor of AveragePool, a constant of the trace."""
    count = np.ones((), np.float64)
    for size, k, s, d, b, e, n in zip(shape, kernel, strides, dilations, begin, end, out_shape):
        lo, hi = (-b, size + e) if include_pad else (max(0, -b), min(size, size + e))
        taps = np.arange(n)[:, None] * s - b + np.arange(k)[None, :] * d
        count = np.multiply.outer(count, ((taps >= lo) & (taps < hi)).sum(axis=1))
    return count


@op
def AveragePool(node, x):
    kernel, strides, dilations, begin, end, _, extra = pool_geometry(node, x.shape[2:])
    total = _window(x, jnp.zeros((), x.dtype), lax.add, kernel, strides, dilations, begin,
                    [e + max(m, 0) for e, m in zip(end, extra)])
    count = _counts(x.shape[2:], kernel, strides, dilations, begin, end,
                    bool(node.attr("count_include_pad", 0)), total.shape[2:])
    return total / jnp.asarray(count, x.dtype)


@op
def LpPool(node, x):
    kernel, strides, dilations, begin, end, _, extra = pool_geometry(node, x.shape[2:])
    p = node.attr("p", 2)
    end = [e + max(m, 0) for e, m in zip(end, extra)]
    total = _window(jnp.abs(x) ** p, jnp.zeros((), x.dtype), lax.add, kernel, strides,
                    dilations, begin, end)
    return total ** (1.0 / p)


@op
def GlobalAveragePool(node, x):
    return _global(jnp.mean, x)


@op
def GlobalMaxPool(node, x):
    return _global(jnp.max, x)


def _global(reduce, x):
    """reduce over the spatial axes, of a channels-last value too (it stays one)."""
    if isinstance(x, ChannelsLast):
        return ChannelsLast(reduce(x.t, axis=tuple(range(1, x.t.ndim - 1)), keepdims=True))
    return reduce(x, axis=tuple(range(2, x.ndim)), keepdims=True)


@op
def GlobalLpPool(node, x):
    p = node.attr("p", 2)
    return jnp.sum(jnp.abs(x) ** p, axis=tuple(range(2, x.ndim)), keepdims=True) ** (1.0 / p)


@op
def MaxUnpool(node, x, indices, output_shape=None):
    shape = unpool_shape(node, x.shape)
    y = jnp.zeros(math.prod(shape), x.dtype).at[indices.reshape(-1)].set(x.reshape(-1))
    y = y.reshape(shape)
    if output_shape is not None:  # a larger output keeps the indices' coordinates
        target = ints(output_shape, "output_shape")
        y = jnp.pad(y, [(0, t - s) for t, s in zip(target, shape)])
    return y
