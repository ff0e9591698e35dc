"""Quantization operators in TensorFlow: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear."""

from __future__ import annotations

import tensorflow as tf

from d500.backends.graph import registry
from d500.backends.tensorflow.core import NARROW, norm_axis, tf_dtype
from d500.backends.tensorflow.dtypes import narrow_cast

OPS, op = registry()

_RANGES = {tf.int8: (-128, 127), tf.uint8: (0, 255), tf.int16: (-32768, 32767),
           tf.uint16: (0, 65535), tf.int32: (-2 ** 31, 2 ** 31 - 1)}


def _broadcast(node, param, x, block_attr=True):
    """Scale/zero point shaped to broadcast against x: per tensor, per axis or blocked."""
    if param.shape.rank == 0 or (param.shape.rank == 1 and param.shape[0] == 1):
        return tf.reshape(param, [])
    r = x.shape.rank
    axis = norm_axis(node.attr("axis", 1), r)
    block = node.attr("block_size", 0)
    if block:
        return tf.repeat(param, block, axis=axis)[
            tuple(slice(0, x.shape[a]) if a == axis else slice(None) for a in range(r))]
    return tf.reshape(param, [-1 if a == axis else 1 for a in range(r)])


@op
def QuantizeLinear(node, x, scale, zero_point=None):
    out_dtype = (zero_point.dtype if zero_point is not None
                 else tf_dtype(node.attr("output_dtype", 0) or 2, node))
    s = tf.cast(_broadcast(node, scale, x), tf.float32)
    if out_dtype in NARROW:
        return _quantize_narrow(node, x, s, zero_point, out_dtype)
    if out_dtype not in _RANGES:
        raise node.unsupported(f"quantization to {out_dtype.name}")
    lo, hi = _RANGES[out_dtype]
    y = tf.round(tf.cast(x, tf.float32) / s)
    if zero_point is not None:
        y = y + tf.cast(_broadcast(node, zero_point, x), tf.float32)
    return tf.cast(tf.clip_by_value(y, lo, hi), out_dtype)


def _narrow(x, dtype):
    class _Saturating:
        def attr(self, name, default=None):
            return {"saturate": 1}.get(name, default)
    return narrow_cast(_Saturating(), x, dtype)


def _quantize_narrow(node, x, s, zero_point, out_dtype):
    """Quantization to float8 (saturating) or 4-bit integers."""
    y = tf.cast(x, tf.float32) / s
    if out_dtype.is_integer:
        bits = 2 if "2" in out_dtype.name else 4
        lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if out_dtype.name.startswith("int") \
            else (0, 2 ** bits - 1)
        y = tf.round(y)
        if zero_point is not None:
            y = y + _narrow(_broadcast(node, zero_point, x), tf.float32)
        return _narrow(tf.clip_by_value(y, lo, hi), out_dtype)
    if zero_point is not None:
        y = y + _narrow(_broadcast(node, zero_point, x), tf.float32)
    return _narrow(y, out_dtype)


@op
def DequantizeLinear(node, x, scale, zero_point=None):
    s = _broadcast(node, scale, x)
    if x.dtype in NARROW:
        y = _narrow(x, tf.float32)
    elif x.dtype in _RANGES:
        y = tf.cast(x, tf.float32)
    else:
        raise node.unsupported(f"dequantization of {x.dtype.name}")
    if zero_point is not None:
        zp = _broadcast(node, zero_point, x)
        y = y - (_narrow(zp, tf.float32) if zp.dtype in NARROW else tf.cast(zp, tf.float32))
    return tf.cast(y * tf.cast(s, tf.float32), scale.dtype)


@op
def DynamicQuantizeLinear(node, x):
    lo = tf.minimum(tf.reduce_min(x), 0.0)
    hi = tf.maximum(tf.reduce_max(x), 0.0)
    scale = (hi - lo) / 255.0
    zp = tf.cast(tf.clip_by_value(tf.round(0 - lo / scale), 0, 255), tf.uint8)
    y = tf.clip_by_value(tf.round(x / scale) + tf.cast(zp, tf.float32), 0, 255)
    return tf.cast(y, tf.uint8), scale, zp


@op
def QLinearMatMul(node, a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero):
    from d500.backends.tensorflow.math import _matmul
    fa = (tf.cast(a, tf.float32) - _row(a_zero, a, -2)) * _row(a_scale, a, -2)
    fb = (tf.cast(b, tf.float32) - _col(b_zero)) * _col(b_scale)
    y = _matmul(fa, fb) / tf.cast(y_scale, tf.float32) + tf.cast(y_zero, tf.float32)
    lo, hi = _RANGES[y_zero.dtype]
    return tf.cast(tf.clip_by_value(tf.round(y), lo, hi), y_zero.dtype)


def _row(v, x, axis):
    v = tf.cast(v, tf.float32)
    return v[:, tf.newaxis] if v.shape.rank == 1 and v.shape[0] != 1 else tf.reshape(v, [-1])[0] \
        if v.shape.num_elements() == 1 else v


def _col(v):
    v = tf.cast(v, tf.float32)
    return tf.reshape(v, [-1])[0] if v.shape.num_elements() == 1 else v


@op
def ConvInteger(node, x, w, x_zero=None, w_zero=None):
    from d500.backends.tensorflow.conv import conv
    from d500.backends.tensorflow.core import plain
    xf = tf.cast(x, tf.float32) - (0 if x_zero is None else tf.cast(x_zero, tf.float32))
    wf = tf.cast(w, tf.float32)
    if w_zero is not None:
        wz = tf.cast(w_zero, tf.float32)
        wf = wf - (tf.reshape(wz, [-1] + [1] * (w.shape.rank - 1)) if wz.shape.rank else wz)
    return tf.cast(tf.round(plain(conv(node, xf, wf))), tf.int32)


@op
def QLinearConv(node, x, xs, xz, w, ws, wz, ys, yz, b=None):
    from d500.backends.tensorflow.conv import conv
    from d500.backends.tensorflow.core import plain
    xf = (tf.cast(x, tf.float32) - tf.cast(xz, tf.float32)) * tf.cast(xs, tf.float32)
    per = [-1] + [1] * (w.shape.rank - 1)
    wzf, wsf = tf.cast(wz, tf.float32), tf.cast(ws, tf.float32)
    wf = (tf.cast(w, tf.float32) - (tf.reshape(wzf, per) if wzf.shape.rank else wzf)) * (
        tf.reshape(wsf, per) if wsf.shape.rank else wsf)
    bias = None
    if b is not None:
        bias = tf.cast(b, tf.float32) * tf.reshape(tf.cast(xs, tf.float32) * wsf, [-1])
    y = plain(conv(node, xf, wf, bias)) / tf.cast(ys, tf.float32) + tf.cast(yz, tf.float32)
    lo, hi = _RANGES[yz.dtype]
    return tf.cast(tf.clip_by_value(tf.round(y), lo, hi), yz.dtype)
