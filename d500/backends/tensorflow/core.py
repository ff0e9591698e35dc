"""Shared helpers of the TensorFlow op table: dtypes, static values, axes and attribute-or-input."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import tensorflow as tf
from tensorflow.python.framework import dtypes as _dtypes

from d500.backends import layout
from d500.backends.layout import plain  # noqa: F401 - the TF modules take it from here

# Inputs (by op type) whose *values* decide shapes: a graph input feeding one of these positions
# is baked into the traced function as a constant (the function is retraced per distinct value).
SHAPE_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "ConstantOfShape": (0,), "Slice": (1, 2, 3, 4),
    "Pad": (1, 2, 3), "Squeeze": (1,), "Unsqueeze": (1,), "Split": (1,), "Resize": (1, 2, 3),
    "Upsample": (1,), "TopK": (1,), "OneHot": (1,), "Range": (0, 1, 2), "ReduceSum": (1,),
    "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,), "ReduceProd": (1,),
    "ReduceL1": (1,), "ReduceL2": (1,), "ReduceLogSum": (1,), "ReduceLogSumExp": (1,),
    "ReduceSumSquare": (1,), "CumSum": (1,), "CumProd": (1,), "Trilu": (1,), "EyeLike": (),
    "Loop": (0, 1), "SplitToSequence": (1, 2), "SequenceAt": (1,), "SequenceInsert": (2,),
    "SequenceErase": (1,), "CenterCropPad": (1,), "Compress": (1,), "Col2Im": (1, 2),
    "DFT": (1, 2), "STFT": (1, 2, 3), "HannWindow": (0,), "HammingWindow": (0,),
    "BlackmanWindow": (0,), "MelWeightMatrix": (0, 1, 2, 3, 4), "NonMaxSuppression": (2,),
    "MaxUnpool": (2,), "If": (0,), "AffineGrid": (1,), "RoiAlign": (1, 2),
}

_ONNX_TO_TF = {
    onnx.TensorProto.FLOAT: tf.float32, onnx.TensorProto.DOUBLE: tf.float64,
    onnx.TensorProto.FLOAT16: tf.float16, onnx.TensorProto.BFLOAT16: tf.bfloat16,
    onnx.TensorProto.INT8: tf.int8, onnx.TensorProto.INT16: tf.int16,
    onnx.TensorProto.INT32: tf.int32, onnx.TensorProto.INT64: tf.int64,
    onnx.TensorProto.UINT8: tf.uint8, onnx.TensorProto.UINT16: tf.uint16,
    onnx.TensorProto.UINT32: tf.uint32, onnx.TensorProto.UINT64: tf.uint64,
    onnx.TensorProto.BOOL: tf.bool, onnx.TensorProto.STRING: tf.string,
    onnx.TensorProto.FLOAT8E4M3FN: _dtypes.float8_e4m3fn,
    onnx.TensorProto.FLOAT8E4M3FNUZ: _dtypes.float8_e4m3fnuz,
    onnx.TensorProto.FLOAT8E5M2: _dtypes.float8_e5m2,
    onnx.TensorProto.FLOAT8E5M2FNUZ: _dtypes.float8_e5m2fnuz,
    onnx.TensorProto.INT4: _dtypes.int4, onnx.TensorProto.UINT4: _dtypes.uint4,
    onnx.TensorProto.FLOAT4E2M1: _dtypes.float4_e2m1fn,
    onnx.TensorProto.INT2: _dtypes.int2, onnx.TensorProto.UINT2: _dtypes.uint2,
}
# Types TensorFlow can hold but (mostly) not compute with: converted through ml_dtypes.
NARROW = {_dtypes.float8_e4m3fn, _dtypes.float8_e4m3fnuz, _dtypes.float8_e5m2,
          _dtypes.float8_e5m2fnuz, _dtypes.int4, _dtypes.uint4, _dtypes.float4_e2m1fn,
          _dtypes.int2, _dtypes.uint2}


def tf_dtype(elem_type: int, node: Any = None) -> tf.DType:
    """The TensorFlow dtype of an ONNX element type."""
    try:
        return _ONNX_TO_TF[elem_type]
    except KeyError:
        name = onnx.TensorProto.DataType.Name(elem_type)
        if node is not None:
            raise node.unsupported(f"element type {name} has no TensorFlow equivalent") from None
        raise


def onnx_dtype(dtype: tf.DType) -> int:
    for k, v in _ONNX_TO_TF.items():
        if v == dtype:
            return k
    raise KeyError(dtype)


def tensor(x: Any, dtype: tf.DType | None = None) -> tf.Tensor:
    """A value as a tensor (NumPy arrays become constants)."""
    if isinstance(x, (tf.Tensor, tf.Variable)):
        return x if dtype is None or x.dtype == dtype else tf.cast(x, dtype)
    if isinstance(x, np.ndarray) and x.dtype == object:
        return tf.constant(x.astype(str).astype(object), dtype=tf.string)
    return tf.convert_to_tensor(x, dtype=dtype)


def static(x: Any) -> np.ndarray | None:
    """The value of `x` when it is known while tracing (a constant or foldable), else None."""
    if x is None:
        return None
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, (int, float, list, tuple)):
        return np.asarray(x)
    try:
        value = tf.get_static_value(x)
    except (TypeError, ValueError, NotImplementedError):
        return None
    return None if value is None else np.asarray(value)


def ints(x: Any, node: Any = None, what: str = "value") -> list[int]:
    """A shape-like input as Python ints; it must be known while tracing."""
    value = static(x)
    if value is None:
        if node is not None:
            raise node.unsupported(f"the {what} must be known when the graph is traced")
        raise ValueError(f"{what} is not static")
    return [int(v) for v in np.asarray(value).reshape(-1)]


def attr_or_input(node: Any, name: str, value: Any, default: Any = None) -> Any:
    """Integers that moved from an attribute to an input in a later opset (axes, split, ...):
    the input's value when given, else the attribute."""
    if value is not None:
        return ints(value, node, name)
    return node.attr(name, default)


def norm_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def norm_axes(axes: Sequence[int], rank: int) -> list[int]:
    return [norm_axis(int(a), rank) for a in axes]


def shape_list(x: tf.Tensor) -> list[Any]:
    """The shape as a list of ints where static, scalar tensors where not."""
    static_shape = x.shape.as_list() if x.shape.rank is not None else None
    if static_shape is not None and all(d is not None for d in static_shape):
        return static_shape
    dynamic = tf.shape(x)
    if static_shape is None:
        return [dynamic[i] for i in range(tf.size(dynamic))]
    return [d if d is not None else dynamic[i] for i, d in enumerate(static_shape)]


def rank(x: tf.Tensor) -> int:
    return x.shape.rank


def with_kernel(fn, x: tf.Tensor, missing: tuple[tf.DType, ...], via: tf.DType, *rest: Any):
    """fn(x, *rest), computed in `via` (and cast back) when x's dtype is in `missing`."""
    if x.dtype in missing:
        return tf.cast(fn(tf.cast(x, via), *[tf.cast(r, via) if isinstance(r, tf.Tensor)
                                             and r.dtype == x.dtype else r for r in rest]),
                       x.dtype)
    return fn(x, *rest)


class ChannelsLast(layout.ChannelsLast):
    """A channels-first (NC...) ONNX value held channels-last (N...C), as TF's CPU kernels want.

    Convolutions and pooling produce these; layout-aware operators (elementwise, batch norm,
    pooling, channel concat) keep them; every other operator receives `plain(value)`.
    """

    __slots__ = ()

    def nchw(self) -> tf.Tensor:
        r = self.t.shape.rank
        return tf.transpose(self.t, [0, r - 1, *range(1, r - 1)])


def to_last(x: Any) -> tf.Tensor:
    """x channels-last: the held tensor of a ChannelsLast, else a transposed NC... tensor."""
    if isinstance(x, ChannelsLast):
        return x.t
    r = x.shape.rank
    return tf.transpose(x, [0, *range(2, r), 1])


def broadcast_last(y: Any, r: int) -> Any:
    """A plain operand broadcastable against a rank-r NC... tensor, moved to channels-last."""
    if y is None or isinstance(y, ChannelsLast):
        return y
    k = y.shape.rank
    if k < r:
        y = tf.reshape(y, [1] * (r - k) + shape_list(y)) if k else tf.reshape(y, [1] * r)
    return tf.transpose(y, [0, *range(2, r), 1])
