"""The softmax family in JAX (Softmax, LogSoftmax, Hardmax) and the losses on
log-probabilities (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss: the shared `nll`)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from d500.backends import nll
from d500.backends.graph import registry
from d500.backends.jax.core import norm_axis

OPS, op = registry()


def _softmax_like(node, x, fn):
    if node.opset >= 13:
        return fn(x, norm_axis(node.attr("axis", -1), x.ndim))
    axis = norm_axis(node.attr("axis", 1), x.ndim)
    flat = x.reshape(math.prod(x.shape[:axis]), -1)
    return fn(flat, 1).reshape(x.shape)


def _shifted(x, axis):
    """x - max(x) along `axis`, in float64 for narrower floats: where x comes out of a reduction
    (the light SqueezeNet's GlobalAveragePool of 1e10 logits), XLA's CPU code recomputed it
    inside the max and inside the subtraction with different float32 roundings, every
    difference came out below -400 and the softmax all NaN."""
    if x.dtype in (jnp.float32, jnp.float16, jnp.bfloat16):
        wide = x.astype(jnp.float64)
        return (wide - jnp.max(wide, axis=axis, keepdims=True)).astype(x.dtype)
    return x - jnp.max(x, axis=axis, keepdims=True)


def _softmax(x, axis):
    e = jnp.exp(_shifted(x, axis))
    return e / jnp.sum(e, axis=axis, keepdims=True)


def _log_softmax(x, axis):
    s = _shifted(x, axis)
    return s - jnp.log(jnp.sum(jnp.exp(s), axis=axis, keepdims=True))


@op
def Softmax(node, x):
    return _softmax_like(node, x, _softmax)


@op
def LogSoftmax(node, x):
    return _softmax_like(node, x, _log_softmax)


@op
def Hardmax(node, x):
    def hardmax(t, axis):
        hot = jax.nn.one_hot(jnp.argmax(t, axis=axis), t.shape[axis], dtype=t.dtype)
        return jnp.moveaxis(hot, -1, axis)
    return _softmax_like(node, x, hardmax)


OPS.update(nll.table(nll.Kit(
    int64=lambda x: x.astype(jnp.int64), where=jnp.where,
    true_like=lambda x: jnp.ones(x.shape, bool),
    pick=lambda log_prob, safe: jnp.take_along_axis(log_prob, safe[:, None], axis=1)[:, 0],
    cast=lambda x, dtype: x.astype(dtype), log_softmax=_log_softmax)))
