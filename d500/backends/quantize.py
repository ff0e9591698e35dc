"""QuantizeLinear, DequantizeLinear, QLinearMatMul and QLinearConv written once over a
framework's primitives (its `Kit`): the Q-linear ops dequantized in float64, computed,
requantized to the output's zero point and range; and the ranges of ONNX's quantized integer
types."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from onnx import TensorProto as T

from d500.backends.graph import in_type, out_type

INT_RANGE = {T.UINT8: (0, 255), T.INT8: (-128, 127), T.UINT16: (0, 65535),
             T.INT16: (-32768, 32767), T.UINT4: (0, 15), T.INT4: (-8, 7)}
if hasattr(T, "UINT2"):
    INT_RANGE.update({T.UINT2: (0, 3), T.INT2: (-2, 1)})


@dataclass(frozen=True)
class Kit:
    """The primitives the Q-linear ops use, as one framework provides them."""

    f64: Callable[[Any], Any]  # x in float64
    scale_shape: Callable[[Any, Any, int, int], Any]  # (x, scale, axis, block): against x
    matmul: Callable[[Any, Any], Any]
    conv: Callable[[Any, Any, Any, Any], Any]  # (node, x, w, bias): ONNX Conv's NC... output
    round: Callable[[Any], Any]
    clip: Callable[[Any, int, int], Any]
    like: Callable[[Any, Any], Any]  # (y, ref): y in ref's dtype
    f32: Callable[[Any], Any]  # x in float32
    onnx_type: Callable[[Any], int]  # a value's ONNX element type
    cast: Callable[[Any, Any, int], Any]  # (node, y, ONNX type): ONNX's Cast, the node's saturate
    stored: Callable[[Any, Any, int], Any]  # (node, y, ONNX integer type): y's whole values in it


def _requantize(kit: Kit, node, y, y_scale, y_zero):
    y = kit.round(y / kit.f64(y_scale)) + kit.f64(y_zero)
    low, high = INT_RANGE[out_type(node) or T.UINT8]
    return kit.like(kit.clip(y, low, high), y_zero)


def DequantizeLinear(kit: Kit, node, x, scale, zero=None):
    axis, block = node.attr("axis", 1), node.attr("block_size", 0)
    s = kit.scale_shape(x, scale, axis, block)
    xf = kit.f32(x)
    if zero is not None:
        xf = xf - kit.f32(kit.scale_shape(x, zero, axis, block))
    y = xf * kit.f32(s)
    return kit.cast(node, y, out_type(node) or kit.onnx_type(scale))


def QuantizeLinear(kit: Kit, node, x, scale, zero=None):
    axis, block = node.attr("axis", 1), node.attr("block_size", 0)
    target = out_type(node) or (in_type(node, 2) if zero is not None else T.UINT8)
    y = kit.f32(x) / kit.f32(kit.scale_shape(x, scale, axis, block))
    if target in INT_RANGE:
        y = kit.round(y)
        if zero is not None:
            y = y + kit.f32(kit.scale_shape(x, zero, axis, block))
        low, high = INT_RANGE[target]
        return kit.stored(node, kit.clip(y, low, high), target)
    if zero is not None:
        y = y + kit.f32(kit.scale_shape(x, zero, axis, block))
    return kit.cast(node, y, target)


def QLinearMatMul(kit: Kit, node, a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero):
    af = (kit.f64(a) - kit.f64(a_zero)) * kit.f64(a_scale)
    bf = (kit.f64(b) - kit.f64(kit.scale_shape(b, b_zero, -1, 0))) * \
        kit.f64(kit.scale_shape(b, b_scale, -1, 0))
    return _requantize(kit, node, kit.matmul(af, bf), y_scale, y_zero)


def QLinearConv(kit: Kit, node, x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero,
                bias=None):
    xf = (kit.f64(x) - kit.f64(x_zero)) * kit.f64(x_scale)
    wf = (kit.f64(w) - kit.f64(kit.scale_shape(w, w_zero, 0, 0))) * \
        kit.f64(kit.scale_shape(w, w_scale, 0, 0))
    b = None
    if bias is not None:
        b = kit.f64(bias) * (kit.f64(x_scale) * kit.f64(w_scale))
    return _requantize(kit, node, kit.conv(node, xf, wf, b), y_scale, y_zero)


def table(kit: Kit) -> dict[str, Any]:
    """The ops bound to a framework's `kit`, keyed as an op table keys them."""
    return {fn.__name__: functools.partial(fn, kit)
            for fn in (DequantizeLinear, QuantizeLinear, QLinearMatMul, QLinearConv)}
