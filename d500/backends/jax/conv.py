"""Convolution JAX ops: Conv, ConvTranspose (their window geometry is the shared `windows`)."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from d500.backends.graph import registry
from d500.backends.jax.core import ChannelsLast, to_last
from d500.backends.windows import transpose_geometry, window_geometry

OPS, op = registry()


def dimension_numbers(n: int) -> lax.ConvDimensionNumbers:
    """ONNX's layouts: N,C,*spatial inputs and outputs; O,I,*spatial kernels."""
    spec = tuple(range(n + 2))
    return lax.ConvDimensionNumbers(spec, spec, spec)


def _bias(y, b):
    return y if b is None else y + b.astype(y.dtype).reshape(-1, *[1] * (y.ndim - 2))


def _precision(x):
    return lax.Precision.HIGHEST


def _conv_dtype(x, w):
    """Integer convolutions accumulate in float64 (exact for the sizes ONNX tests use)."""
    if jnp.issubdtype(x.dtype, jnp.integer):
        return x.astype(jnp.float64), w.astype(jnp.float64), x.dtype
    return x, w.astype(x.dtype), None


def channels_last_numbers(n: int) -> lax.ConvDimensionNumbers:
    """N,*spatial,C inputs and outputs; ONNX's O,I,*spatial kernels (XLA moves those)."""
    last = (0, n + 1, *range(1, n + 1))
    return lax.ConvDimensionNumbers(last, tuple(range(n + 2)), last)


@op
def Conv(node, x, w, b=None):
    """Float convolutions run channels-last (x: a ChannelsLast or NC...; the output a
    ChannelsLast, see core.ChannelsLast); integer ones in ONNX's layout."""
    kernel = list(w.shape[2:])
    last = isinstance(x, ChannelsLast) or (len(kernel) > 0 and jnp.issubdtype(x.dtype,
                                                                             jnp.floating))
    if last:
        x = to_last(x)
    shape = (x.shape[0], x.shape[-1], *x.shape[1:-1]) if last else x.shape
    strides, dilations, begin, end = window_geometry(node, shape[2:], kernel)
    x, w, back = _conv_dtype(x, w)
    y = lax.conv_general_dilated(
        x, w, strides, list(zip(begin, end)), rhs_dilation=dilations,
        dimension_numbers=(channels_last_numbers if last else dimension_numbers)(len(kernel)),
        feature_group_count=node.attr("group", 1), precision=_precision(x))
    if last:
        return ChannelsLast(y if b is None else y + b.astype(y.dtype))
    y = _bias(y, b)
    return y if back is None else jnp.round(y).astype(back)


@op
def ConvTranspose(node, x, w, b=None):
    n = x.ndim - 2
    kernel = list(w.shape[2:])
    strides, dilations, out_pad, begin, end = transpose_geometry(node, x.shape[2:], kernel)
    group = node.attr("group", 1)
    # the transpose as a convolution of the stride-dilated input with the flipped kernel
    c_in, c_out = w.shape[0], w.shape[1]
    k = w.reshape(group, c_in // group, c_out, *kernel)
    k = jnp.swapaxes(k, 1, 2).reshape(group * c_out, c_in // group, *kernel)
    k = jnp.flip(k, axis=tuple(range(2, n + 2)))
    padding = [((kk - 1) * d - bg, (kk - 1) * d - e + p)
               for kk, d, bg, e, p in zip(kernel, dilations, begin, end, out_pad)]
    x, k, back = _conv_dtype(x, k)
    y = lax.conv_general_dilated(
        x, k, [1] * n, padding, lhs_dilation=strides, rhs_dilation=dilations,
        dimension_numbers=dimension_numbers(n), feature_group_count=group,
        precision=_precision(x))
    y = _bias(y, b)
    return y if back is None else jnp.round(y).astype(back)
