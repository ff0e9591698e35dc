"""Normalization JAX ops: batch (inference and training form), instance, layer and Lp
normalization, LRN."""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from d500.backends.graph import registry
from d500.backends.jax.core import ChannelsLast, like, norm_axis

OPS, op = registry()


def _channel(v, x):
    """A per-channel vector shaped to broadcast against N,C,*spatial x."""
    return v.astype(x.dtype).reshape(-1, *[1] * (x.ndim - 2))


def _last(v, x):
    """A per-channel vector as it broadcasts against N,*spatial,C x: as it is."""
    return v


def _inference(x, scale, bias, mean, var, eps, channel=_channel):
    """x * a + b with a = scale / sqrt(var + eps), b = bias - mean * a, per channel (as torch's
    kernel computes it). Written (x - mean) * a + bias, one more elementwise operation on the
    activations, it split XLA's YNNPACK fusions: 5 regions instead of 2 in the ResNet of
    benchmarks/jax_vs_native.py, with bias broadcasts materialised between them."""
    a = lax.rsqrt(var.astype(x.dtype) + like(eps, x)) * scale.astype(x.dtype)
    return x * channel(a, x) + channel(bias.astype(x.dtype) - mean.astype(x.dtype) * a, x)


@op
def BatchNormalization(node, x, scale, bias, mean, var):
    """Spatial forms on a ChannelsLast x stay channels-last (core.ChannelsLast)."""
    eps = node.attr("epsilon", 1e-5)
    spatial = node.opset >= 9 or node.attr("spatial", 1)
    if isinstance(x, ChannelsLast):
        if not spatial:
            x = x.nchw()
        else:
            out = _batch_norm(node, x.t, scale, bias, mean, var, eps, _last)
            return (ChannelsLast(out[0]), *out[1:]) if isinstance(out, tuple) else (
                ChannelsLast(out))
    if not spatial:
        # BN-7 spatial=0: statistics of shape (C, D1, ..., Dn), per batch-flattened feature
        flat = x.reshape(x.shape[0], -1)
        y = _inference(flat, *(v.reshape(-1) for v in (scale, bias, mean, var)), eps)
        return y.reshape(x.shape)
    return _batch_norm(node, x, scale, bias, mean, var, eps, _channel)


def _batch_norm(node, x, scale, bias, mean, var, eps, channel):
    """Batch norm with channel vectors shaped by `channel` (NC...: _channel; channels-last: as
    they are), the channel axis first after the batch or last."""
    axes = (0, *range(2, x.ndim)) if channel is _channel else tuple(range(x.ndim - 1))
    if node.opset >= 14 and node.attr("training_mode", 0):
        momentum = node.attr("momentum", 0.9)
        batch_mean = jnp.mean(x, axis=axes)
        batch_var = jnp.mean(jnp.square(x - channel(batch_mean.astype(x.dtype), x)), axis=axes)
        y = _inference(x, scale, bias, batch_mean, batch_var, eps, channel)
        m = like(momentum, mean)
        return (y, mean * m + batch_mean.astype(mean.dtype) * (1 - m),
                var * m + batch_var.astype(var.dtype) * (1 - m))
    return _inference(x, scale, bias, mean, var, eps, channel)


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
