"""Elementwise torch ops: arithmetic, comparison, logic, bitwise, unary math, casts."""

from __future__ import annotations

import functools

import numpy as np
import torch
from onnx import TensorProto as T

from d500.backends.graph import in_type, out_type, registry
from d500.backends.torch import dtypes
from d500.backends.torch.table import wrap

OPS, op = registry()
_SIGN = -(2**63)  # uint64 is stored as int64; flipping this bit maps unsigned order to signed


def _uint64(node, a) -> bool:
    return a.dtype == torch.int64 and in_type(node, 0) == T.UINT64


def _unsigned(fn, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A NumPy ufunc on two uint64 values stored as int64 (division and remainder)."""
    ua, ub = (dtypes.to_numpy(t).view(np.uint64) for t in (a, b))
    return torch.from_numpy(np.asarray(fn(ua, ub)).view(np.int64)).to(a.device)


# -- arithmetic -------------------------------------------------------------------------------
@op
def Add(node, a, b):
    return wrap(node, a + b)


@op
def Sub(node, a, b):
    return wrap(node, a - b)


@op
def Mul(node, a, b):
    return wrap(node, a * b)


@op
def Div(node, a, b):
    if a.is_floating_point() or a.is_complex():
        return a / b
    if _uint64(node, a):
        return _unsigned(np.floor_divide, a, b)
    return torch.div(a, b, rounding_mode="trunc").to(a.dtype)


@op
def Mod(node, a, b):
    if _uint64(node, a):
        return _unsigned(np.mod, a, b)
    if node.attr("fmod", 0):
        return torch.fmod(a, b)
    return torch.remainder(a, b)


@op
def Pow(node, a, b):
    if not a.is_floating_point() and b.is_floating_point():
        return wrap(node, torch.pow(a.to(b.dtype), b).to(a.dtype))
    return wrap(node, torch.pow(a, b).to(a.dtype))


@op
def Neg(node, x):
    return -x


@op
def Sum(node, *xs):
    return wrap(node, functools.reduce(torch.add, xs))


@op
def Mean(node, *xs):
    return functools.reduce(torch.add, xs) / len(xs)


def _extreme(node, fn, xs):
    if len(xs) == 1:
        return xs[0].clone()
    if _uint64(node, xs[0]):
        return functools.reduce(fn, [x ^ _SIGN for x in xs]) ^ _SIGN
    return functools.reduce(fn, xs)


@op
def Max(node, *xs):
    return _extreme(node, torch.maximum, xs)


@op
def Min(node, *xs):
    return _extreme(node, torch.minimum, xs)


@op
def Clip(node, x, low=None, high=None):
    if node.opset < 11:
        low, high = node.attr("min"), node.attr("max")
    else:
        low = None if low is None else low.item()
        high = None if high is None else high.item()
    if low is None and high is None:
        return x.clone()
    return torch.clamp(x, low, high)


# -- unary math ---------------------------------------------------------------------------------
def _unary(fn):
    return lambda node, x: fn(x)


for _name, _fn in {
    "Exp": torch.exp, "Log": torch.log, "Sqrt": torch.sqrt, "Floor": torch.floor,
    "Ceil": torch.ceil, "Round": torch.round, "Sin": torch.sin, "Cos": torch.cos,
    "Tan": torch.tan, "Asin": torch.asin, "Acos": torch.acos, "Atan": torch.atan,
    "Sinh": torch.sinh, "Cosh": torch.cosh, "Asinh": torch.asinh, "Acosh": torch.acosh,
    "Atanh": torch.atanh, "Erf": torch.erf, "IsNaN": torch.isnan, "Abs": torch.abs,
    "Reciprocal": torch.reciprocal, "Sign": torch.sign, "Not": torch.logical_not,
}.items():
    op(_unary(_fn), names=(_name,))


@op
def IsInf(node, x):
    pos, neg = node.attr("detect_positive", 1), node.attr("detect_negative", 1)
    if pos and neg:
        return torch.isinf(x)
    if pos:
        return torch.isposinf(x)
    if neg:
        return torch.isneginf(x)
    return torch.zeros_like(x, dtype=torch.bool)


# -- comparison and logic -----------------------------------------------------------------------
@op
def Equal(node, a, b):
    if isinstance(a, np.ndarray):
        return torch.from_numpy(np.asarray(a == b))
    return torch.eq(a, b)


def _ordered(fn):
    def compare(node, a, b):
        if _uint64(node, a):
            a, b = a ^ _SIGN, b ^ _SIGN
        return fn(a, b)
    return compare


for _name, _fn in {"Less": torch.lt, "LessOrEqual": torch.le, "Greater": torch.gt,
                   "GreaterOrEqual": torch.ge}.items():
    op(_ordered(_fn), names=(_name,))


def _binary(fn):
    return lambda node, a, b: fn(a, b)


for _name, _fn in {"And": torch.logical_and, "Or": torch.logical_or, "Xor": torch.logical_xor,
                   "BitwiseAnd": torch.bitwise_and, "BitwiseOr": torch.bitwise_or,
                   "BitwiseXor": torch.bitwise_xor}.items():
    op(_binary(_fn), names=(_name,))


@op
def Where(node, cond, a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.where(cond.cpu().numpy(), a, b)
    return torch.where(cond, a, b)


# -- bitwise -------------------------------------------------------------------------------------
@op
def BitwiseNot(node, x):
    return wrap(node, torch.bitwise_not(x))


@op
def BitShift(node, a, b):
    b = b.to(a.dtype) if a.dtype != torch.uint8 else b
    if node.attr("direction") == "LEFT":
        return wrap(node, torch.bitwise_left_shift(a, b))
    if _uint64(node, a):  # a logical shift, not torch's arithmetic one
        return _unsigned(np.right_shift, a, b)
    return torch.bitwise_right_shift(a, b)


# -- casts ---------------------------------------------------------------------------------------
@op
def Cast(node, x):
    return dtypes.cast(x, node.attr("to"), bool(node.attr("saturate", 1)),
                       node.attr("round_mode", "up"))


@op
def CastLike(node, x, like):
    to = in_type(node, 1) or dtypes.NATURAL[like.dtype]
    return dtypes.cast(x, to, bool(node.attr("saturate", 1)), node.attr("round_mode", "up"))


@op
def BitCast(node, x):
    array = dtypes.to_numpy(x, in_type(node, 0))
    return dtypes.from_numpy(array.view(dtypes.np_dtype(node.attr("to") or out_type(node))),
                             x.device)
