"""Convolution JAX ops (Conv, ConvTranspose) and the window geometry they share with pooling."""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from d500.backends.graph import registry
from d500.backends.jax.core import ChannelsLast, to_last

OPS, op = registry()


def window_geometry(node, x, kernel: list[int]
                    ) -> tuple[list[int], list[int], list[int], list[int]]:
    """(strides, dilations, pads_begin, pads_end) of a conv/pool node for input `x`."""
    n = len(kernel)
    strides = list(node.attr("strides") or [1] * n)
    dilations = list(node.attr("dilations") or [1] * n)
    auto_pad = node.attr("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for size, k, s, d in zip(x.shape[2:], kernel, strides, dilations):
            total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small = total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else total - small)
            end.append(total - begin[-1])
        return strides, dilations, begin, end
    if auto_pad == "VALID":
        return strides, dilations, [0] * n, [0] * n
    pads = node.attr("pads") or [0] * (2 * n)
    return strides, dilations, list(pads[:n]), list(pads[n:])


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
    strides, dilations, begin, end = window_geometry(node, _Shaped(shape), kernel)
    x, w, back = _conv_dtype(x, w)
    y = lax.conv_general_dilated(
        x, w, strides, list(zip(begin, end)), rhs_dilation=dilations,
        dimension_numbers=(channels_last_numbers if last else dimension_numbers)(len(kernel)),
        feature_group_count=node.attr("group", 1), precision=_precision(x))
    if last:
        return ChannelsLast(y if b is None else y + b.astype(y.dtype))
    y = _bias(y, b)
    return y if back is None else jnp.round(y).astype(back)


class _Shaped:
    """A stand-in with the NC... shape that window_geometry reads."""

    def __init__(self, shape: tuple[int, ...]):
        self.shape = shape


@op
def ConvTranspose(node, x, w, b=None):
    n = x.ndim - 2
    kernel = list(w.shape[2:])
    strides = list(node.attr("strides") or [1] * n)
    dilations = list(node.attr("dilations") or [1] * n)
    out_pad = list(node.attr("output_padding") or [0] * n)
    group = node.attr("group", 1)
    auto_pad = node.attr("auto_pad", "NOTSET")
    output_shape = node.attr("output_shape")
    full = [s * (i - 1) + (k - 1) * d + 1 + p
            for i, k, s, d, p in zip(x.shape[2:], kernel, strides, dilations, out_pad)]
    if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = (list(output_shape)[-n:] if output_shape is not None
                  else [i * s for i, s in zip(x.shape[2:], strides)])
        totals = [f - t for f, t in zip(full, target)]
        if auto_pad == "SAME_UPPER":
            begin = [t // 2 for t in totals]
        elif auto_pad == "SAME_LOWER":
            begin = [t - t // 2 for t in totals]
        else:  # explicit output_shape: the output starts at the first full position
            begin = [0] * n
        end = [t - bg for t, bg in zip(totals, begin)]
    else:
        pads = node.attr("pads") or [0] * (2 * n)
        begin, end = list(pads[:n]), list(pads[n:])
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
