"""Normalization JAX ops: batch (inference and training form), instance, layer and Lp
normalization, LRN."""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from d500.backends.graph import registry
from d500.backends.jax.core import like, norm_axis

OPS, op = registry()


def _channel(v, x):
    """A per-channel vector shaped to broadcast against N,C,*spatial x."""
    return v.astype(x.dtype).reshape(-1, *[1] * (x.ndim - 2))


def _inference(x, scale, bias, mean, var, eps):
    inv = lax.rsqrt(_channel(var, x) + like(eps, x))
    return (x - _channel(mean, x)) * (inv * _channel(scale, x)) + _channel(bias, x)


@op
def BatchNormalization(node, x, scale, bias, mean, var):
    eps = node.attr("epsilon", 1e-5)
    if node.opset < 9 and not node.attr("spatial", 1):
        # BN-7 spatial=0: statistics of shape (C, D1, ..., Dn), per batch-flattened feature
        flat = x.reshape(x.shape[0], -1)
        y = _inference(flat, *(v.reshape(-1) for v in (scale, bias, mean, var)), eps)
        return y.reshape(x.shape)
    if node.opset >= 14 and node.attr("training_mode", 0):
        momentum = node.attr("momentum", 0.9)
        axes = (0, *range(2, x.ndim))
        batch_mean = jnp.mean(x, axis=axes)
        batch_var = jnp.mean(jnp.square(x - _channel(batch_mean, x)), axis=axes)
        y = _inference(x, scale, bias, batch_mean, batch_var, eps)
        m = like(momentum, mean)
        return (y, mean * m + batch_mean.astype(mean.dtype) * (1 - m),
                var * m + batch_var.astype(var.dtype) * (1 - m))
    return _inference(x, scale, bias, mean, var, eps)


@op
def InstanceNormalization(node, x, scale, bias):
    axes = tuple(range(2, x.ndim))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    y = (x - mean) * lax.rsqrt(var + like(node.attr("epsilon", 1e-5), x))
    return y * _channel(scale, x) + _channel(bias, x)


@op
def LayerNormalization(node, x, scale, bias=None):
    axis = norm_axis(node.attr("axis", -1), x.ndim)
    eps = node.attr("epsilon", 1e-5)
    compute = jnp.float32 if x.dtype in (jnp.float16, jnp.bfloat16) else x.dtype
    if node.attr("stash_type", 1) != 1:
        compute = x.dtype
    xc = x.astype(compute)
    axes = tuple(range(axis, x.ndim))
    mean = jnp.mean(xc, axis=axes, keepdims=True)
    inv = lax.rsqrt(jnp.mean(jnp.square(xc - mean), axis=axes, keepdims=True)
                    + jnp.asarray(eps, compute))
    y = ((xc - mean) * inv).astype(x.dtype) * scale
    if bias is not None:
        y = y + bias
    return y, mean, inv


@op
def LpNormalization(node, x):
    p = node.attr("p", 2)
    axis = node.attr("axis", -1)
    norm = jnp.sum(jnp.abs(x) ** p, axis=axis, keepdims=True) ** (1.0 / p)
    return jnp.where(norm == 0, jnp.zeros((), x.dtype), x / jnp.where(norm == 0, 1, norm))


@op
def LRN(node, x):
    size = node.attr("size")
    alpha, beta, bias = node.attr("alpha", 1e-4), node.attr("beta", 0.75), node.attr("bias", 1.0)
    before, after = (size - 1) // 2, math.ceil((size - 1) / 2)
    window = (1, size, *[1] * (x.ndim - 2))
    pad = [(0, 0), (before, after), *[(0, 0)] * (x.ndim - 2)]
    total = lax.reduce_window(jnp.square(x), jnp.zeros((), x.dtype), lax.add, window,
                              (1,) * x.ndim, pad)
    return x / (like(bias, x) + like(alpha / size, x) * total) ** like(beta, x)
