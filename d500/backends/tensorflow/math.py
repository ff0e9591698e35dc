"""Elementwise arithmetic, comparison, logic, bitwise, matrix and cast operators in TensorFlow."""

from __future__ import annotations

import functools

import tensorflow as tf

from d500.backends.graph import registry
from d500.backends.tensorflow.core import (
    norm_axis,
    onnx_dtype,
    static,
    tensor,
    tf_dtype,
    with_kernel,
)
from d500.backends.tensorflow.dtypes import cast

OPS, op = registry()

_INT = (tf.int8, tf.int16, tf.int32, tf.int64, tf.uint8, tf.uint16, tf.uint32, tf.uint64)
_UINT = (tf.uint8, tf.uint16, tf.uint32, tf.uint64)


@op
def Add(node, a, b):
    return a + b


@op
def Sub(node, a, b):
    return a - b


@op
def Mul(node, a, b):
    return a * b


@op
def Div(node, a, b):
    if a.dtype in _INT:
        return tf.truncatediv(a, b)
    return a / b


@op
def Pow(node, a, b):
    if a.dtype == b.dtype and a.dtype not in _UINT:
        return tf.pow(a, b)
    wide = tf.float64 if a.dtype.is_floating or b.dtype.is_floating else tf.int64
    return tf.cast(tf.pow(tf.cast(a, wide), tf.cast(b, wide)), a.dtype)


@op
def Mod(node, a, b):
    if node.attr("fmod", 0):
        return with_kernel(tf.truncatemod, a, (tf.float16, tf.bfloat16), tf.float32, b)
    return tf.math.floormod(a, b)


@op
def Neg(node, x):
    return -x


@op
def Abs(node, x):
    return x if x.dtype in _UINT else tf.abs(x)


@op
def Sign(node, x):
    if x.dtype in _UINT:
        return tf.cast(x > 0, x.dtype)
    return tf.sign(x)


@op
def Round(node, x):
    return tf.round(x)  # half to even, as ONNX


def _unary(fn):
    return lambda node, x: fn(x)


for _name, _fn in {
    "Sin": tf.sin, "Cos": tf.cos, "Tan": tf.tan, "Asin": tf.asin, "Acos": tf.acos,
    "Atan": tf.atan, "Sinh": tf.sinh, "Cosh": tf.cosh, "Asinh": tf.asinh, "Acosh": tf.acosh,
    "Atanh": tf.atanh, "Tanh": tf.tanh, "IsNaN": tf.math.is_nan,
    "Reciprocal": tf.math.reciprocal, "Floor": tf.floor, "Ceil": tf.math.ceil, "Sqrt": tf.sqrt,
    "Exp": tf.exp, "Log": tf.math.log, "Erf": tf.math.erf, "Not": tf.logical_not,
    "BitwiseNot": tf.bitwise.invert,
}.items():
    op(_unary(_fn), names=(_name,))


@op
def IsInf(node, x):
    pos, neg = node.attr("detect_positive", 1), node.attr("detect_negative", 1)
    if x.dtype in _INT:
        return tf.zeros_like(x, tf.bool)
    return tf.logical_or(tf.logical_and(x > 0, tf.math.is_inf(x)) if pos else False,
                         tf.logical_and(x < 0, tf.math.is_inf(x)) if neg else False)


def _variadic(fn, node, *xs):
    return functools.reduce(fn, [x for x in xs if x is not None])


@op
def Max(node, *xs):
    if xs[0].dtype == tf.bool:
        return _variadic(tf.logical_or, node, *xs)
    return _variadic(tf.maximum, node, *xs)


@op
def Min(node, *xs):
    if xs[0].dtype == tf.bool:
        return _variadic(tf.logical_and, node, *xs)
    return _variadic(tf.minimum, node, *xs)


@op
def Sum(node, *xs):
    return _variadic(tf.add, node, *xs)


@op
def Mean(node, *xs):
    return Sum(node, *xs) / tf.cast(len([x for x in xs if x is not None]), xs[0].dtype)


def _binary(fn):
    return lambda node, a, b: fn(a, b)


for _name, _fn in {"Equal": tf.equal, "And": tf.logical_and, "Or": tf.logical_or,
                   "Xor": tf.math.logical_xor, "BitwiseAnd": tf.bitwise.bitwise_and,
                   "BitwiseOr": tf.bitwise.bitwise_or,
                   "BitwiseXor": tf.bitwise.bitwise_xor}.items():
    op(_binary(_fn), names=(_name,))


def _ordered(fn):
    def run(node, a, b):
        if a.dtype == tf.bool:
            a, b = tf.cast(a, tf.int8), tf.cast(b, tf.int8)
        return fn(a, b)
    return run


for _name, _fn in {"Less": tf.less, "Greater": tf.greater, "LessOrEqual": tf.less_equal,
                   "GreaterOrEqual": tf.greater_equal}.items():
    op(_ordered(_fn), names=(_name,))


@op
def BitShift(node, a, b):
    """Shifts by a negative amount or by the bit width or more saturate, as ONNX says."""
    bits = a.dtype.size * 8
    a, b = tf.broadcast_to(a, tf.broadcast_dynamic_shape(tf.shape(a), tf.shape(b))), b + a * 0
    inside = tf.logical_and(b >= 0, b < bits)
    safe = tf.where(inside, b, tf.zeros_like(b))
    if node.attr("direction") == "LEFT":
        return tf.where(inside, tf.bitwise.left_shift(a, safe), tf.zeros_like(a))
    spill = tf.where(a < 0, -tf.ones_like(a), tf.zeros_like(a)) if not a.dtype.is_unsigned \
        else tf.zeros_like(a)
    return tf.where(inside, tf.bitwise.right_shift(a, safe), spill)


@op
def Where(node, cond, a, b):
    return tf.where(cond, a, b)


# -- matrices -----------------------------------------------------------------
_NO_MATMUL = (tf.int8, tf.int16, tf.uint8, tf.uint16, tf.uint32, tf.uint64)


def _matmul(a, b):
    if a.dtype == tf.float16:  # accumulate in float32, as NumPy does
        return tf.cast(_matmul(tf.cast(a, tf.float32), tf.cast(b, tf.float32)), a.dtype)
    if a.dtype in _NO_MATMUL:
        return tf.cast(_matmul(tf.cast(a, tf.int64), tf.cast(b, tf.int64)), a.dtype)
    if a.shape.rank == 1 and b.shape.rank == 1:
        return tf.reduce_sum(a * b)
    if a.shape.rank == 1:
        return tf.squeeze(tf.matmul(a[tf.newaxis], b), -2)
    if b.shape.rank == 1:
        return tf.squeeze(tf.matmul(a, b[:, tf.newaxis]), -1)
    return tf.matmul(a, b)


@op
def MatMul(node, a, b):
    return _matmul(a, b)


@op
def MatMulInteger(node, a, b, a_zero=None, b_zero=None):
    a, b = tf.cast(a, tf.int32), tf.cast(b, tf.int32)
    if a_zero is not None:
        az = tf.cast(a_zero, tf.int32)
        a = a - (az[:, tf.newaxis] if az.shape.rank == 1 and az.shape[0] != 1 else az)
    if b_zero is not None:
        b = b - tf.cast(b_zero, tf.int32)
    return tf.cast(_matmul(tf.cast(a, tf.int64), tf.cast(b, tf.int64)), tf.int32)


@op
def Gemm(node, a, b, c=None):
    trans_a, trans_b = bool(node.attr("transA", 0)), bool(node.attr("transB", 0))
    if a.dtype in (tf.float32, tf.float64) and a.shape.rank == 2 and b.shape.rank == 2:
        # the transposes as MatMul's flags: no Transpose op forward nor in the gradient
        y = tf.matmul(a, b, transpose_a=trans_a, transpose_b=trans_b)
    else:
        y = _matmul(tf.transpose(a) if trans_a else a, tf.transpose(b) if trans_b else b)
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    if alpha != 1.0:
        y = y * tf.cast(alpha, y.dtype)
    if c is not None:
        if c.shape.rank == 2 and c.shape[0] == 1:  # a row: keep TF's bias-add fusion happy
            c = tf.reshape(c, [-1])
        c = c if beta == 1.0 else c * tf.cast(beta, c.dtype)
        if (c.shape.rank == 1 and y.shape.rank == 2 and c.dtype.is_floating
                and c.shape[0] is not None and c.shape[0] == y.shape[1]):
            return tf.nn.bias_add(y, c)  # as Keras's Dense: MatMul+BiasAdd fuse, BiasAddGrad
        y = y + c
    return y


@op
def Einsum(node, *xs):
    equation = node.attr("equation").replace(" ", "")
    if xs[0].dtype in _NO_MATMUL + (tf.int32,):
        return tf.cast(tf.einsum(equation, *[tf.cast(x, tf.int64) for x in xs]), xs[0].dtype)
    return tf.einsum(equation, *xs)


@op
def Det(node, x):
    return tf.linalg.det(x)


def _cumulative(fn, node, x, axis):
    axis = norm_axis(int(static(axis).reshape(-1)[0]), x.shape.rank)
    return with_kernel(lambda v: fn(v, axis=axis, exclusive=bool(node.attr("exclusive", 0)),
                                    reverse=bool(node.attr("reverse", 0))),
                       x, (tf.uint16, tf.uint32, tf.uint64), tf.int64)


@op
def CumSum(node, x, axis):
    return _cumulative(tf.cumsum, node, x, axis)


@op
def CumProd(node, x, axis):
    return _cumulative(tf.math.cumprod, node, x, axis)


@op
def Clip(node, x, lo=None, hi=None):
    if node.opset < 11:
        lo, hi = node.attr("min"), node.attr("max")
        lo = None if lo is None else tf.cast(lo, x.dtype)
        hi = None if hi is None else tf.cast(hi, x.dtype)
    if lo is not None:
        x = tf.maximum(x, tensor(lo, x.dtype))
    if hi is not None:
        x = tf.minimum(x, tensor(hi, x.dtype))
    return x


@op
def BitCast(node, x):
    to = tf_dtype(node.attr("to"), node)
    if x.dtype == tf.bool or to == tf.bool:  # one byte either way: 0 or 1
        return tf.cast(x, to)
    return tf.bitcast(x, to)


@op
def Cast(node, x):
    return cast(node, x, node.attr("to"))


@op
def CastLike(node, x, like):
    return cast(node, x, onnx_dtype(like.dtype))
