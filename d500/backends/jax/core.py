"""Shared helpers of the JAX op table: static values, dtypes, axes and attribute-or-input.

Inside the jitted graph a value is a tracer unless it is known while tracing: a constant, a
baked (shape-deciding) input, a shape, or a node computed from those alone (ops.py folds such
nodes eagerly). `static(x)` is that value as NumPy, or None.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto as T

from d500.backends import layout

# ONNX element type -> the NumPy/JAX dtype holding it (JAX computes in every one of these once
# 64-bit types are enabled, see executable.py; strings stay NumPy object arrays, known at trace).
DTYPES: dict[int, Any] = {
    T.FLOAT: np.float32, T.DOUBLE: np.float64, T.FLOAT16: np.float16,
    T.BFLOAT16: ml_dtypes.bfloat16, T.INT8: np.int8, T.INT16: np.int16, T.INT32: np.int32,
    T.INT64: np.int64, T.UINT8: np.uint8, T.UINT16: np.uint16, T.UINT32: np.uint32,
    T.UINT64: np.uint64, T.BOOL: np.bool_, T.COMPLEX64: np.complex64,
    T.COMPLEX128: np.complex128, T.STRING: np.object_,
    T.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn, T.FLOAT8E4M3FNUZ: ml_dtypes.float8_e4m3fnuz,
    T.FLOAT8E5M2: ml_dtypes.float8_e5m2, T.FLOAT8E5M2FNUZ: ml_dtypes.float8_e5m2fnuz,
    T.INT4: ml_dtypes.int4, T.UINT4: ml_dtypes.uint4, T.FLOAT4E2M1: ml_dtypes.float4_e2m1fn,
}
for _name, _dtype in (("INT2", "int2"), ("UINT2", "uint2"), ("FLOAT8E8M0", "float8_e8m0fnu")):
    if hasattr(T, _name) and hasattr(ml_dtypes, _dtype):
        DTYPES[getattr(T, _name)] = getattr(ml_dtypes, _dtype)
# Types JAX stores but has few kernels for: computed in float32 / int8 and rounded back.
NARROW = {np.dtype(DTYPES[t]) for t in DTYPES if t in (
    T.FLOAT8E4M3FN, T.FLOAT8E4M3FNUZ, T.FLOAT8E5M2, T.FLOAT8E5M2FNUZ, T.INT4, T.UINT4,
    T.FLOAT4E2M1) or T.DataType.Name(t) in ("INT2", "UINT2", "FLOAT8E8M0")}


class NotStatic(Exception):
    """An operator needs a value while tracing that is only known when the graph runs; `value`,
    when given, is the input it needed (so that only that one is baked)."""

    def __init__(self, what: str, value: Any = None):
        super().__init__(what)
        self.value = value


def dtype_of(elem_type: int, node: Any = None) -> np.dtype:
    """The NumPy/JAX dtype of an ONNX element type."""
    try:
        return np.dtype(DTYPES[elem_type])
    except KeyError:
        name = T.DataType.Name(elem_type) if elem_type in T.DataType.values() else elem_type
        if node is not None:
            raise node.unsupported(f"element type {name} has no JAX equivalent") from None
        raise


def onnx_type(dtype: Any) -> int:
    return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def static(x: Any) -> np.ndarray | None:
    """The value of `x` when it is known while tracing, as NumPy; else None."""
    if x is None or is_tracer(x):
        return None
    if isinstance(x, (list, tuple)):
        return None
    return np.asarray(x)


def ints(x: Any, what: str = "value") -> list[int]:
    """A shape-like input as Python ints; it must be known while tracing."""
    value = static(x)
    if value is None:
        raise NotStatic(what, x)
    return [int(v) for v in np.asarray(value).reshape(-1)]


def attr_or_input(node: Any, name: str, value: Any, default: Any = None) -> Any:
    """Integers that moved from an attribute to an input in a later opset (axes, split, ...)."""
    if value is not None:
        return ints(value, name)
    return node.attr(name, default)


def norm_axis(axis: int, rank: int) -> int:
    return int(axis) + rank if axis < 0 else int(axis)


def norm_axes(axes: Sequence[int], rank: int) -> list[int]:
    return [norm_axis(int(a), rank) for a in axes]


def array(x: Any, dtype: Any = None) -> Any:
    """A value as a JAX array (tracers and string arrays left as they are)."""
    if isinstance(x, np.ndarray) and x.dtype.kind in "OUS":
        return x
    if is_tracer(x):
        return x if dtype is None or x.dtype == dtype else x.astype(dtype)
    return jnp.asarray(x, dtype=dtype)


def like(value: Any, x: Any) -> Any:
    """A Python or NumPy scalar as an array of x's dtype (no promotion to 64 bits)."""
    return jnp.asarray(value, dtype=x.dtype)


def is_float(x: Any) -> bool:
    return jnp.issubdtype(x.dtype, jnp.floating)


def is_int(x: Any) -> bool:
    return jnp.issubdtype(x.dtype, jnp.integer)


def with_kernel(fn, x: Any, *rest: Any, via: Any = np.float32) -> Any:
    """fn(x, *rest), computed in `via` and cast back when x's dtype is narrow (float8, int4)."""
    if np.dtype(x.dtype) in NARROW:
        return fn(x.astype(via), *[r.astype(via) if hasattr(r, "dtype") and r.dtype == x.dtype
                                   else r for r in rest]).astype(x.dtype)
    return fn(x, *rest)


@jax.tree_util.register_pytree_node_class
class ChannelsLast(layout.ChannelsLast):
    """A channels-first (NC...) ONNX value held channels-last (N...C), as XLA's CPU convolutions
    want it. XLA runs an NCHW convolution channels-last inside, and in a jitted backward it
    moved activations between the two layouts around every convolution (56 more transposes
    than the same network written channels-last, benchmarks/jax_vs_native.py). Conv, batch
    norm and global pooling produce these; elementwise operators keep them; every other
    operator receives `layout.plain(value)` (ops.py). A pytree, so it crosses jax.jit and lax
    control flow as its array."""

    __slots__ = ()

    def nchw(self) -> Any:
        r = self.t.ndim
        return jnp.transpose(self.t, (0, r - 1, *range(1, r - 1)))

    def tree_flatten(self) -> tuple[tuple[Any], None]:
        return (self.t,), None

    @classmethod
    def tree_unflatten(cls, _: None, children: tuple[Any]) -> ChannelsLast:
        return cls(*children)


def to_last(x: Any) -> Any:
    """x channels-last: the held array of a ChannelsLast, else a transposed NC... array."""
    if isinstance(x, ChannelsLast):
        return x.t
    return jnp.transpose(x, (0, *range(2, x.ndim), 1))


def broadcast_last(y: Any, r: int) -> Any:
    """A plain operand broadcastable against a rank-r NC... value, moved to channels-last."""
    if y is None or isinstance(y, ChannelsLast) or not hasattr(y, "ndim"):
        return y
    if y.ndim < r:
        y = jnp.reshape(y, (1,) * (r - y.ndim) + tuple(y.shape))
    return jnp.transpose(y, (0, *range(2, r), 1))
