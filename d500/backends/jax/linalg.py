"""Linear algebra and quantization in JAX: MatMul, Gemm, Einsum, Det, integer and Q-linear ops."""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax

from d500.backends import quantize
from d500.backends.graph import registry
from d500.backends.jax import dtypes
from d500.backends.jax.conv import Conv
from d500.backends.jax.core import norm_axis, onnx_type
from d500.backends.layout import plain

OPS, op = registry()
_HIGHEST = lax.Precision.HIGHEST


@op
def MatMul(node, a, b):
    if jnp.issubdtype(a.dtype, jnp.inexact):
        return jnp.matmul(a, b, precision=_HIGHEST)
    return jnp.matmul(a.astype(jnp.int64), b.astype(jnp.int64)).astype(a.dtype)


@op
def Gemm(node, a, b, c=None):
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    if node.attr("transA", 0):
        a = a.T
    if node.attr("transB", 0):
        b = b.T
    y = jnp.matmul(a, b, precision=_HIGHEST)
    if alpha != 1.0:
        y = y * jnp.asarray(alpha, y.dtype)
    if c is not None:
        y = y + (c * jnp.asarray(beta, c.dtype) if beta != 1.0 else c)
    return y.astype(a.dtype)


@op
def Einsum(node, *xs):
    return jnp.einsum(node.attr("equation").replace(" ", ""), *xs, precision=_HIGHEST)


@op
def Det(node, x):
    return jnp.linalg.det(x)


# -- integer matmul and convolution --------------------------------------------------------------
def _centered(x, zero_point, axis=None):
    x = x.astype(jnp.int64) if not jnp.issubdtype(x.dtype, jnp.floating) else x
    if zero_point is None:
        return x
    zp = zero_point.astype(x.dtype)
    if axis is not None and zp.size > 1:
        shape = [1] * x.ndim
        shape[axis] = -1
        zp = zp.reshape(shape)
    return x - zp


@op
def MatMulInteger(node, a, b, a_zero=None, b_zero=None):
    a = _centered(a, a_zero, 0 if a_zero is not None and a_zero.ndim else None)
    b = _centered(b, b_zero, b.ndim - 1 if b_zero is not None and b_zero.ndim else None)
    return jnp.matmul(a, b).astype(jnp.int32)


@op
def ConvInteger(node, x, w, x_zero=None, w_zero=None):
    xc = _centered(x, x_zero).astype(jnp.float64)
    wc = _centered(w, w_zero, 0).astype(jnp.float64)
    return jnp.round(plain(Conv(node, xc, wc))).astype(jnp.int32)


def _scale_shape(x, scale, axis, block):
    """`scale` (or a zero point) broadcastable against `x`: scalar, per-axis or per-block."""
    if scale.ndim == 0 or scale.size == 1 and not block:
        return scale.reshape(())
    axis = norm_axis(axis, x.ndim)
    if block:
        return lax.slice_in_dim(jnp.repeat(scale, block, axis=axis), 0, x.shape[axis], axis=axis)
    shape = [1] * x.ndim
    shape[axis] = -1
    return scale.reshape(shape)


class _CastNode:
    """The attributes a cast reads (saturate, round mode) for a cast inside another op."""

    def __init__(self, node, **attrs):
        self._node, self._attrs = node, attrs

    def attr(self, name, default=None):
        return self._attrs.get(name, self._node.attr(name, default))

    def unsupported(self, why):
        return self._node.unsupported(why)


def _cast(node, y, to):
    return dtypes.cast(_CastNode(node), y, to)


def _divided(a, b):
    """a / b in float32, correctly rounded: computed in float64 and rounded once. XLA compiling
    the division alone (jax:eager) multiplies by b's reciprocal, and a quotient just under a
    half then rounds to it (-2.5 / (5.5 / 255): 25 where ONNX's reference gives 26)."""
    return (a.astype(jnp.float64) / b.astype(jnp.float64)).astype(jnp.float32)


@op
def DynamicQuantizeLinear(node, x):
    low = jnp.minimum(jnp.min(x), 0).astype(jnp.float32)
    high = jnp.maximum(jnp.max(x), 0).astype(jnp.float32)
    scale = (high - low) / jnp.float32(255.0)
    safe = jnp.where(scale == 0, jnp.float32(1), scale)
    zero = jnp.where(scale == 0, 0, jnp.clip(jnp.round(_divided(-low, safe)), 0, 255))
    y = jnp.where(scale == 0, zero, jnp.round(_divided(x, safe)) + zero)
    return (jnp.clip(y, 0, 255).astype(jnp.uint8), scale, zero.astype(jnp.uint8))


OPS.update(quantize.table(quantize.Kit(
    f64=lambda x: x.astype(jnp.float64), scale_shape=_scale_shape,
    matmul=functools.partial(jnp.matmul, precision=_HIGHEST),
    conv=lambda node, x, w, b: plain(Conv(node, x, w, b)), round=jnp.round, clip=jnp.clip,
    like=lambda y, ref: y.astype(ref.dtype), f32=lambda x: x.astype(jnp.float32),
    onnx_type=lambda v: onnx_type(v.dtype), cast=_cast, stored=_cast)))
