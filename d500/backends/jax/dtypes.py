"""Element-type conversions in JAX: ONNX Cast semantics over JAX's dtypes, strings (NumPy, known
while tracing) and the narrow float8/int4/float4 types (saturating where ONNX asks)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from onnx import TensorProto as T

from d500.backends.jax.core import NARROW, NotStatic, dtype_of, static


def cast(node, x: Any, to: int) -> Any:
    """ONNX Cast of `x` to element type `to`."""
    target = dtype_of(to, node)
    saturate = bool(node.attr("saturate", 1))
    if isinstance(x, np.ndarray) and x.dtype.kind in "OUS":
        return _from_strings(node, x, to, target)
    if to == T.STRING:
        value = static(x)
        if value is None:
            raise NotStatic("tensor cast to strings", x)
        return _to_strings(value)
    if x.dtype == target:
        return x
    if target in NARROW or np.dtype(x.dtype) in NARROW:
        return narrow(node, x, to, target, saturate)
    if jnp.issubdtype(x.dtype, jnp.floating) and jnp.issubdtype(target, jnp.integer):
        x = jnp.where(jnp.isfinite(x), x, jnp.zeros((), x.dtype))  # NaN/inf: undefined in ONNX
    if target == np.bool_ and jnp.issubdtype(x.dtype, jnp.complexfloating):
        return x != 0
    return x.astype(target)


def narrow(node, x, to: int, target, saturate: bool):
    """Casts into or out of float8/float4/int4: exact values first through ONNX's own rounding
    rules (the reference's cast_to, on values known while tracing), else JAX's conversion."""
    value = static(x)
    if value is not None and target in NARROW:
        from onnx.reference.ops.op_cast import cast_to
        source = value.astype(np.float32) if value.dtype == ml_dtypes.bfloat16 else value
        return jnp.asarray(cast_to(source, to, saturate, node.attr("round_mode", "up")))
    if np.dtype(x.dtype) in NARROW:
        x = x.astype(np.float32)
    if target in NARROW and to == getattr(T, "FLOAT8E8M0", None):
        # its rounding modes have no JAX conversion: ONNX's own, as a host callback
        from onnx.reference.ops.op_cast import cast_to
        mode = node.attr("round_mode", "up")
        return jax.pure_callback(
            lambda a: np.asarray(cast_to(np.asarray(a, np.float32), to, saturate, mode)),
            jax.ShapeDtypeStruct(x.shape, target), x)
    if target in NARROW and jnp.issubdtype(target, jnp.floating) and saturate:
        limit = float(ml_dtypes.finfo(target).max)
        x = jnp.where(jnp.isnan(x), x, jnp.clip(x, -limit, limit))
    elif target in NARROW and jnp.issubdtype(target, jnp.integer):
        # as NumPy (and ONNX's reference) convert: truncated, then wrapped into the range
        info = ml_dtypes.iinfo(target)
        v = (jnp.trunc(x) if jnp.issubdtype(x.dtype, jnp.floating) else x).astype(jnp.int64)
        span = int(info.max) - int(info.min) + 1
        x = (v - int(info.min)) % span + int(info.min)
    return x.astype(target)


def _to_strings(value: np.ndarray) -> np.ndarray:
    """Numbers as ONNX writes them in strings: float32 by their shortest float32 repr."""
    flat = value.reshape(-1)
    if value.dtype == np.float32:
        out = [str(np.float32(v)) for v in flat]
    elif value.dtype.kind == "f":
        out = [str(v) for v in flat.astype(np.float64)]
    else:
        out = [str(v) for v in flat.tolist()]
    return np.array(out, dtype=object).reshape(value.shape)


def _from_strings(node, x: np.ndarray, to: int, target) -> Any:
    if to == T.STRING:
        return x
    if target in NARROW:
        from onnx.reference.ops.op_cast import cast_to
        return jnp.asarray(cast_to(x.astype(np.float32), to, bool(node.attr("saturate", 1)),
                                   node.attr("round_mode", "up")))
    if target == np.bool_:
        return jnp.asarray(x.astype(np.float64) != 0)
    return jnp.asarray(x.astype(target if target != ml_dtypes.bfloat16 else np.float32)
                       .astype(target))
