"""The optimizer ops on TensorFlow: plain tf ops, traced once into the caller's tf.function.

State lives in tf.Variables made at init (never inside a trace); in-place ops `assign` them. A
TensorFlow intermediate is immutable, so an in-place op on one replaces the list entry. Scalar
tensors of another float dtype are cast to the tensor's dtype. Contract:
d500/training/optimizers/ops/__init__.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

name = "tensorflow"


def _c(s: Any, x: Any) -> Any:
    """A scalar in x's dtype (Python numbers convert by themselves)."""
    if isinstance(s, (tf.Tensor, tf.Variable)) and s.dtype != x.dtype:
        return tf.cast(s, x.dtype)
    return s


def _is_one(s: Any) -> bool:
    return isinstance(s, (int, float)) and s == 1.0


def _each(s: Any, n: int) -> Sequence[Any]:
    return s if isinstance(s, (list, tuple)) else [s] * n


def _put(xs: list[Any], i: int, value: Any) -> None:
    if isinstance(xs[i], tf.Variable):
        xs[i].assign(value)
    else:
        xs[i] = value


def _add_to(xs: list[Any], i: int, delta: Any) -> None:
    """xs[i] += delta: one AssignAddVariableOp on a variable (no read, no separate add)."""
    if isinstance(xs[i], tf.Variable):
        xs[i].assign_add(delta)
    else:
        xs[i] = xs[i] + delta


# -- creation ---------------------------------------------------------------------------------
def full_like(xs: Sequence[Any], value: float) -> list[tf.Variable]:
    return [tf.Variable(tf.fill(x.shape, tf.constant(value, x.dtype)), trainable=False)
            for x in xs]


def zeros_like(xs: Sequence[Any]) -> list[tf.Variable]:
    return [tf.Variable(tf.zeros(x.shape, x.dtype), trainable=False) for x in xs]


def vector(values: Sequence[float], like: Any) -> tf.Tensor:
    return tf.constant(list(values), dtype=like.dtype)


def counter() -> tf.Variable:
    return tf.Variable(0, dtype=tf.int64, trainable=False)


def increment(c: tf.Variable) -> tf.Tensor:
    return tf.cast(c.assign_add(1), tf.float32)


# -- functional -------------------------------------------------------------------------------
def add(xs: Sequence[Any], ys: Any, alpha: Any = 1.0) -> list[tf.Tensor]:
    if isinstance(ys, (list, tuple)):
        return [x + _c(alpha, x) * y for x, y in zip(xs, ys)]
    return [x + _c(alpha, x) * _c(ys, x) for x in xs]


def mul(xs: Sequence[Any], s: Any) -> list[tf.Tensor]:
    return [x * _c(si, x) for x, si in zip(xs, _each(s, len(xs)))]


def div(xs: Sequence[Any], ys: Sequence[Any]) -> list[tf.Tensor]:
    return [x / y for x, y in zip(xs, ys)]


def sqrt(xs: Sequence[Any]) -> list[tf.Tensor]:
    return [tf.sqrt(x) for x in xs]


def sign(xs: Sequence[Any]) -> list[tf.Tensor]:
    return [tf.sign(x) for x in xs]


def maximum(xs: Sequence[Any], ys: Sequence[Any]) -> list[tf.Tensor]:
    return [tf.maximum(x, y) for x, y in zip(xs, ys)]


def norm(xs: Sequence[Any]) -> list[tf.Tensor]:
    return [tf.sqrt(tf.reduce_sum(tf.square(x))) for x in xs]


def stack(scalars: Sequence[Any]) -> tf.Tensor:
    return tf.stack(list(scalars))


def unstack(v: tf.Tensor) -> list[tf.Tensor]:
    return tf.unstack(v)


def where(c: Any, a: Any, b: Any) -> tf.Tensor:
    a = tf.convert_to_tensor(a)
    return tf.where(c, a, tf.cast(b, a.dtype))


def bias_correction(beta: float, t: Any) -> tf.Tensor:
    return tf.cast(1.0 - tf.pow(tf.constant(beta, tf.float64), tf.cast(t, tf.float64)),
                   tf.float32)


# -- in place ---------------------------------------------------------------------------------
def assign_(xs: list[Any], ys: Sequence[Any]) -> None:
    for i, y in enumerate(ys):
        _put(xs, i, y)


def add_(xs: list[Any], ys: Any, alpha: Any = 1.0) -> None:
    for i, y in enumerate(_each(ys, len(xs))):
        x = xs[i]
        _add_to(xs, i, _c(alpha, x) * _c(y, x) if not _is_one(alpha) else _c(y, x))


def mul_(xs: list[Any], s: Any) -> None:
    for i, si in enumerate(_each(s, len(xs))):
        _put(xs, i, xs[i] * _c(si, xs[i]))


def lerp_(xs: list[Any], ys: Sequence[Any], w: Any) -> None:
    for i, y in enumerate(ys):
        x = xs[i]
        _add_to(xs, i, _c(w, x) * (y - x))


def addcmul_(xs: list[Any], ys: Sequence[Any], zs: Sequence[Any], value: Any = 1.0) -> None:
    for i, (y, z) in enumerate(zip(ys, zs)):
        x = xs[i]
        _add_to(xs, i, _c(value, x) * (y * z))


def addcdiv_(xs: list[Any], ys: Sequence[Any], zs: Sequence[Any], value: Any = 1.0) -> None:
    for i, (y, z) in enumerate(zip(ys, zs)):
        x = xs[i]
        _add_to(xs, i, _c(value, x) * (y / z))


def no_grad() -> contextlib.nullcontext[None]:
    return contextlib.nullcontext()
