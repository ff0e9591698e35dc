"""Elementwise JAX ops: arithmetic, comparison, logic, bitwise, unary math, casts."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

from d500.backends.graph import registry
from d500.backends.jax import dtypes
from d500.backends.jax.core import NARROW, dtype_of, is_float, is_int, like, static, with_kernel

OPS, op = registry()


# -- arithmetic -------------------------------------------------------------------------------
@op
def Add(node, a, b):
    return with_kernel(jnp.add, a, b)


@op
def Sub(node, a, b):
    return with_kernel(jnp.subtract, a, b)


@op
def Mul(node, a, b):
    return with_kernel(jnp.multiply, a, b)


@op
def Div(node, a, b):
    if is_int(a):
        if jnp.issubdtype(a.dtype, jnp.unsignedinteger):
            return jnp.floor_divide(a, b)
        q = jnp.abs(a) // jnp.abs(b)  # truncating, as C
        return jnp.where((a < 0) != (b < 0), -q, q).astype(a.dtype)
    return with_kernel(jnp.divide, a, b)


@op
def Mod(node, a, b):
    if node.attr("fmod", 0):
        return jnp.fmod(a, b)
    return jnp.remainder(a, b)


@op
def Pow(node, a, b):
    if is_int(a) and is_float(b):
        return jnp.power(a.astype(b.dtype), b).astype(a.dtype)
    if is_float(a) and b.dtype != a.dtype:
        return jnp.power(a, b.astype(a.dtype))
    if is_int(a):
        return jnp.power(a, b.astype(a.dtype))
    return jnp.power(a, b)


@op
def Neg(node, x):
    return -x


@op
def Abs(node, x):
    return jnp.abs(x)


@op
def Reciprocal(node, x):
    return 1 / x


@op
def Sign(node, x):
    return jnp.sign(x)


@op
def Sum(node, *xs):
    return functools.reduce(jnp.add, xs)


@op
def Mean(node, *xs):
    return functools.reduce(jnp.add, xs) / len(xs)


@op
def Max(node, *xs):
    return functools.reduce(jnp.maximum, xs)


@op
def Min(node, *xs):
    return functools.reduce(jnp.minimum, xs)


@op
def Clip(node, x, low=None, high=None):
    if node.opset < 11:
        low, high = node.attr("min"), node.attr("max")
        low = None if low is None else like(low, x)
        high = None if high is None else like(high, x)
    if low is not None:
        x = jnp.maximum(x, low.astype(x.dtype))
    if high is not None:
        x = jnp.minimum(x, high.astype(x.dtype))
    return x


# -- unary math ---------------------------------------------------------------------------------
def _unary(fn):
    return lambda node, x: with_kernel(fn, x)


for _name, _fn in {
    "Exp": jnp.exp, "Log": jnp.log, "Sqrt": jnp.sqrt, "Floor": jnp.floor, "Ceil": jnp.ceil,
    "Round": jnp.round, "Sin": jnp.sin, "Cos": jnp.cos, "Tan": jnp.tan, "Asin": jnp.arcsin,
    "Acos": jnp.arccos, "Atan": jnp.arctan, "Sinh": jnp.sinh, "Cosh": jnp.cosh,
    "Asinh": jnp.arcsinh, "Acosh": jnp.arccosh, "Atanh": jnp.arctanh, "IsNaN": jnp.isnan,
}.items():
    op(_unary(_fn), names=(_name,))


@op
def Erf(node, x):
    from jax.scipy.special import erf
    return with_kernel(erf, x)


@op
def IsInf(node, x):
    pos, neg = node.attr("detect_positive", 1), node.attr("detect_negative", 1)
    if pos and neg:
        return jnp.isinf(x)
    if pos:
        return jnp.isposinf(x)
    if neg:
        return jnp.isneginf(x)
    return jnp.zeros(x.shape, bool)


# -- comparison and logic -----------------------------------------------------------------------
def _compare(fn, host):
    def compare(node, a, b):
        if isinstance(a, np.ndarray) and a.dtype.kind in "OUS":
            return jnp.asarray(host(a, b))
        return with_kernel(lambda x, y: fn(x, y).astype(jnp.float32), a, b).astype(bool) if (
            np.dtype(a.dtype) in NARROW) else fn(a, b)
    return compare


for _name, _fn in {"Equal": np.equal, "Less": np.less, "LessOrEqual": np.less_equal,
                   "Greater": np.greater, "GreaterOrEqual": np.greater_equal}.items():
    op(_compare(getattr(jnp, _fn.__name__), _fn), names=(_name,))


def _binary(fn):
    return lambda node, a, b: fn(a, b)


for _name, _fn in {"And": jnp.logical_and, "Or": jnp.logical_or, "Xor": jnp.logical_xor,
                   "BitwiseAnd": jnp.bitwise_and, "BitwiseOr": jnp.bitwise_or,
                   "BitwiseXor": jnp.bitwise_xor}.items():
    op(_binary(_fn), names=(_name,))


@op
def Not(node, x):
    return jnp.logical_not(x)


@op
def Where(node, cond, a, b):
    if any(isinstance(v, np.ndarray) and v.dtype.kind in "OUS" for v in (a, b)):
        c = static(cond)
        return np.where(c, a, b)
    return jnp.where(cond, a, b)


# -- bitwise -------------------------------------------------------------------------------------
@op
def BitwiseNot(node, x):
    return jnp.bitwise_not(x)


@op
def BitShift(node, a, b):
    b = b.astype(a.dtype)
    if node.attr("direction") == "LEFT":
        return jnp.left_shift(a, b)
    return jnp.right_shift(a, b)


# -- casts ---------------------------------------------------------------------------------------
@op
def Cast(node, x):
    return dtypes.cast(node, x, node.attr("to"))


@op
def CastLike(node, x, target):
    from d500.backends.jax.core import onnx_type
    return dtypes.cast(node, x, onnx_type(np.asarray(target).dtype if isinstance(
        target, np.ndarray) else target.dtype))


@op
def BitCast(node, x):
    target = dtype_of(node.attr("to"), node)
    from jax import lax
    if x.dtype == jnp.bool_ or target == np.bool_:  # one byte each way; JAX refuses bools
        source = x.astype(jnp.uint8) if x.dtype == jnp.bool_ else x
        bits = lax.bitcast_convert_type(source, jnp.uint8)
        return bits != 0 if target == np.bool_ else lax.bitcast_convert_type(bits, target)
    return lax.bitcast_convert_type(x, target)
