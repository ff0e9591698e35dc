"""Element types of level-0 cases: their NumPy dtypes (bfloat16 from ml_dtypes, which onnx
already depends on), whether one is floating point, its limits, and values as it holds them."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

# What a case's `dtype` (and `--dtype`) may be.
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64")
# Floating-point types NumPy itself lacks: ml_dtypes gives them (their dtype kind is "V").
_EXTENDED_FLOATS = {np.dtype(ml_dtypes.bfloat16)}


def numpy_dtype(name: Any) -> np.dtype:
    """The NumPy dtype of a dtype name or dtype ("bfloat16" included)."""
    if isinstance(name, str) and name == "bfloat16":
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def is_float(dtype: Any) -> bool:
    """Whether `dtype` is a floating-point type (float16/32/64 or bfloat16)."""
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or dtype in _EXTENDED_FLOATS


def is_exact(dtype: Any) -> bool:
    """Integers and booleans: compared exactly, never differentiated."""
    return np.dtype(dtype).kind in "iub"


def finfo(dtype: Any) -> Any:
    """Machine limits of a floating-point dtype (ml_dtypes.finfo also knows bfloat16)."""
    return ml_dtypes.finfo(numpy_dtype(dtype))


def saturate(outputs: list[np.ndarray], dtype: np.dtype) -> list[np.ndarray]:
    """The reference's outputs as `dtype` holds them: beyond its largest finite value (rounding
    to nearest), +-inf, as IEEE overflow gives; what an operator in that dtype must return."""
    if not is_float(dtype):
        return outputs
    info = finfo(dtype)
    limit = float(info.max) * (1.0 + float(info.eps) / 4)
    out = []
    for o in outputs:
        if is_float(o.dtype):
            with np.errstate(invalid="ignore"):
                o = np.where(np.abs(o) >= limit, np.copysign(np.inf, o), o)
        out.append(o)
    return out
