"""Element-type conversions in TensorFlow: ONNX Cast semantics over TF's dtypes, including
strings, bfloat16 and the narrow float8/int4/float4 types TF has few kernels for."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import tensorflow as tf
from tensorflow.python.framework import dtypes as _dtypes

from d500.backends.tensorflow.core import NARROW, tf_dtype


def cast(node, x, to):
    """ONNX Cast of `x` to element type `to` (strings, bfloat16 and the narrow types too)."""
    dtype = tf_dtype(to, node)
    if x.dtype == dtype:
        return x
    if dtype in NARROW or x.dtype in NARROW:
        return narrow_cast(node, x, dtype)
    if dtype == tf.string:
        if x.dtype.is_floating:
            return float_to_string(x)
        return tf.strings.as_string(x)
    if x.dtype == tf.string:
        if dtype == tf.bool:
            return tf.strings.to_number(x, tf.float64) != 0
        wide = tf.float64 if dtype.is_floating else tf.int64
        return tf.cast(tf.strings.to_number(x, wide), dtype)
    if x.dtype.is_floating and dtype.is_integer:
        x = tf.where(tf.math.is_finite(x), x, tf.zeros_like(x))  # NaN/inf: undefined in ONNX
    if x.dtype == tf.bfloat16 or dtype == tf.bfloat16:
        return tf.cast(tf.cast(x, tf.float32), dtype)
    return tf.cast(x, dtype)


def narrow_cast(node, x, dtype):
    """Casts to/from float8, int4, float4: TF's own kernels where they exist, else ml_dtypes."""
    saturate = node.attr("saturate", 1)
    if dtype in NARROW and dtype.is_floating and saturate and x.dtype != tf.string:
        limit = float(ml_dtypes.finfo(dtype.as_numpy_dtype).max)
        x = tf.cast(x, tf.float32) if x.dtype in NARROW else x
        x = tf.where(tf.math.is_nan(x), x, tf.clip_by_value(x, -limit, limit))
    if x.dtype == tf.string:
        x = cast(node, x, onnx.TensorProto.FLOAT)
    if dtype == tf.string:
        return cast(node, narrow_cast(node, x, tf.float32), onnx.TensorProto.STRING)
    native = {_dtypes.float8_e4m3fn, _dtypes.float8_e5m2}
    if (dtype in native and x.dtype in (tf.float32, tf.float16, tf.bfloat16)) or (
            x.dtype in native and dtype in (tf.float32, tf.float16, tf.bfloat16)):
        return tf.cast(x, dtype)
    target = dtype.as_numpy_dtype
    return tf.numpy_function(lambda a: np.asarray(a).astype(target), [x], dtype, stateful=False)


def float_to_string(x):
    """Floats as ONNX writes them in strings: float32 values by their shortest float32 repr."""
    def fmt(a):
        flat = np.asarray(a).reshape(-1)
        return np.array([str(np.float32(v)) if a.dtype == np.float32 else str(v)
                         for v in flat], dtype=object).reshape(np.shape(a)).astype(bytes)
    return tf.numpy_function(fmt, [x], tf.string, stateful=False)
