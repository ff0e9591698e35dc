"""ONNX element types in torch: which torch dtype stores each, and conversions to and from NumPy.

torch lacks CPU arithmetic for uint16/32/64, so those are stored widened (uint16 as int32,
uint32 and uint64 as int64; uint64 keeps its bit pattern and wraps like two's complement).
Types torch cannot compute in at all (float8, float4, float6, int4, uint4, int2, uint2) are
stored as float32 or int8/uint8 holding exactly the representable values; Cast rounds into
them through ONNX's NumPy conversion. Strings stay NumPy object arrays.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto as T

# ONNX element type -> the torch dtype a value of that type is stored in.
STORAGE: dict[int, torch.dtype] = {
    T.FLOAT: torch.float32, T.DOUBLE: torch.float64, T.FLOAT16: torch.float16,
    T.BFLOAT16: torch.bfloat16, T.INT8: torch.int8, T.INT16: torch.int16, T.INT32: torch.int32,
    T.INT64: torch.int64, T.UINT8: torch.uint8, T.BOOL: torch.bool,
    T.UINT16: torch.int32, T.UINT32: torch.int64, T.UINT64: torch.int64,
    T.COMPLEX64: torch.complex64, T.COMPLEX128: torch.complex128,
    T.FLOAT8E4M3FN: torch.float32, T.FLOAT8E4M3FNUZ: torch.float32,
    T.FLOAT8E5M2: torch.float32, T.FLOAT8E5M2FNUZ: torch.float32, T.FLOAT8E8M0: torch.float32,
    T.FLOAT4E2M1: torch.float32,
    T.INT4: torch.int8, T.UINT4: torch.uint8,
}
for _name, _storage in (("INT2", torch.int8), ("UINT2", torch.uint8),
                        ("FLOAT6E2M3", torch.float32), ("FLOAT6E3M2", torch.float32)):
    if hasattr(T, _name):
        STORAGE[getattr(T, _name)] = _storage

# Types stored in a wider torch dtype: casting into them must wrap or round explicitly.
EMULATED = {t for t in STORAGE if t not in (
    T.FLOAT, T.DOUBLE, T.FLOAT16, T.BFLOAT16, T.INT8, T.INT16, T.INT32, T.INT64, T.UINT8,
    T.BOOL, T.COMPLEX64, T.COMPLEX128)}
_UINT_BITS = {T.UINT16: 16, T.UINT32: 32}

# torch dtype -> the ONNX type it most naturally means (used when the graph gives no type).
NATURAL: dict[torch.dtype, int] = {
    torch.float32: T.FLOAT, torch.float64: T.DOUBLE, torch.float16: T.FLOAT16,
    torch.bfloat16: T.BFLOAT16, torch.int8: T.INT8, torch.int16: T.INT16, torch.int32: T.INT32,
    torch.int64: T.INT64, torch.uint8: T.UINT8, torch.bool: T.BOOL,
    torch.complex64: T.COMPLEX64, torch.complex128: T.COMPLEX128,
}


# NumPy dtypes torch stores as they are (from_numpy converts nothing; the others below)
_AS_IS = {np.dtype(t) for t in (np.float32, np.float64, np.float16, np.int8, np.int16, np.int32,
                                np.int64, np.uint8, np.bool_, np.complex64, np.complex128)}


def storage(elem_type: int) -> torch.dtype:
    """The torch dtype that stores ONNX element type `elem_type`."""
    try:
        return STORAGE[elem_type]
    except KeyError:
        name = T.DataType.Name(elem_type) if elem_type in T.DataType.values() else elem_type
        raise TypeError(f"ONNX element type {name} has no torch storage") from None


@functools.cache
def np_dtype(elem_type: int) -> np.dtype:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))


def elem_type_of(array: np.ndarray) -> int:
    return onnx.helper.np_dtype_to_tensor_dtype(array.dtype)


def from_numpy(array: Any, device: torch.device | str = "cpu") -> Any:
    """A NumPy value as the torch tensor that stores it (strings stay NumPy)."""
    if isinstance(array, list):
        return [from_numpy(a, device) for a in array]
    if array is None or isinstance(array, torch.Tensor):
        return array
    array = np.asarray(array)
    if array.dtype in _AS_IS:
        pass  # stored as it is
    elif array.dtype.kind in "OUS":
        return array
    elif (elem := elem_type_of(array)) == T.UINT64:
        array = array.view(np.int64)
    elif elem in (T.BFLOAT16, T.UINT16, T.UINT32) or elem in EMULATED:
        target = storage(elem)
        if target == torch.bfloat16:
            return torch.from_numpy(array.astype(np.float32)).to(device, torch.bfloat16)
        array = array.astype(str(target).removeprefix("torch."))
    if not array.flags.c_contiguous or not array.flags.writeable:
        array = array.copy()
    if device == "cpu" or getattr(device, "type", None) == "cpu":
        return torch.from_numpy(array)  # the same memory as as_tensor's, a third of its time
    return torch.as_tensor(array, device=device)


def to_numpy(value: Any, elem_type: int | None = None) -> Any:
    """A stored torch value as a NumPy array of ONNX element type `elem_type` (lists: each)."""
    if isinstance(value, (list, tuple)):
        return [to_numpy(v, elem_type) for v in value]
    if value is None or isinstance(value, np.ndarray) and value.dtype.kind in "OUS":
        return value
    if not isinstance(value, torch.Tensor):
        value = torch.as_tensor(value)
    value = value.detach()
    if value.device.type != "cpu":
        value = value.cpu()
    if value.dtype == torch.bfloat16:
        array = value.float().numpy().astype(np_dtype(T.BFLOAT16))
    else:
        array = value.resolve_conj().numpy()
    if elem_type is None or elem_type == 0:
        return array
    want = np_dtype(elem_type)
    return array if array.dtype == want else array.astype(want)


def cast(x: torch.Tensor, to: int, saturate: bool = True, round_mode: str = "up") -> Any:
    """ONNX Cast of a stored value into element type `to`, stored again."""
    if to == T.STRING:
        return to_numpy(x).astype(np.str_).astype(object)
    if isinstance(x, np.ndarray):  # strings
        return from_numpy(x.astype(np_dtype(to) if to not in EMULATED else np.float32))
    target = storage(to)
    if to in _UINT_BITS:
        return (x.to(torch.int64) & ((1 << _UINT_BITS[to]) - 1)).to(target)
    if to == T.UINT64:
        return x.to(torch.int64)
    if to in EMULATED:
        from onnx.reference.ops.op_cast import cast_to
        source = x.detach().cpu()
        source = source.float() if source.dtype == torch.bfloat16 else source
        rounded = cast_to(source.numpy(), to, saturate, round_mode)
        return from_numpy(rounded, x.device)
    return x.to(target)
