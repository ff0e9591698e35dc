"""The optimizer ops on NumPy arrays: the reference the torch and TensorFlow ops are checked
against.

In-place ops write into the arrays (`out=`), keeping their dtype. Contract:
d500/training/optimizers/ops/__init__.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np

name = "numpy"


class Counter:
    """A step counter: a Python int in a box."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


def _each(s: Any, n: int) -> Sequence[Any]:
    return s if isinstance(s, (list, tuple)) else [s] * n


# -- creation ---------------------------------------------------------------------------------
def full_like(xs: Sequence[np.ndarray], value: float) -> list[np.ndarray]:
    return [np.full_like(x, value) for x in xs]


def zeros_like(xs: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [np.zeros_like(x) for x in xs]


def vector(values: Sequence[float], like: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=like.dtype)


def counter() -> Counter:
    return Counter()


def increment(c: Counter) -> int:
    c.n += 1
    return c.n


# -- functional -------------------------------------------------------------------------------
def add(xs: Sequence[Any], ys: Any, alpha: Any = 1.0) -> list[np.ndarray]:
    if isinstance(ys, (list, tuple)):
        return [x + alpha * y for x, y in zip(xs, ys)]
    return [x + alpha * ys for x in xs]


def mul(xs: Sequence[Any], s: Any) -> list[np.ndarray]:
    return [x * si for x, si in zip(xs, _each(s, len(xs)))]


def div(xs: Sequence[Any], ys: Sequence[Any]) -> list[np.ndarray]:
    return [x / y for x, y in zip(xs, ys)]


def sqrt(xs: Sequence[Any]) -> list[np.ndarray]:
    return [np.sqrt(x) for x in xs]


def sign(xs: Sequence[Any]) -> list[np.ndarray]:
    return [np.sign(x) for x in xs]


def maximum(xs: Sequence[Any], ys: Sequence[Any]) -> list[np.ndarray]:
    return [np.maximum(x, y) for x, y in zip(xs, ys)]


def norm(xs: Sequence[np.ndarray]) -> list[Any]:
    return [np.sqrt(np.vdot(x, x)) for x in xs]


def stack(scalars: Sequence[Any]) -> np.ndarray:
    return np.stack(scalars)


def unstack(v: np.ndarray) -> list[Any]:
    return list(v)


def where(c: Any, a: Any, b: Any) -> np.ndarray:
    return np.where(c, a, b)


def bias_correction(beta: float, t: int) -> float:
    return 1.0 - beta ** t


# -- in place ---------------------------------------------------------------------------------
def assign_(xs: Sequence[np.ndarray], ys: Sequence[Any]) -> None:
    for x, y in zip(xs, ys):
        np.copyto(x, y, casting="same_kind")


def add_(xs: Sequence[np.ndarray], ys: Any, alpha: Any = 1.0) -> None:
    if isinstance(ys, (list, tuple)):
        for x, y in zip(xs, ys):
            np.add(x, alpha * y, out=x, casting="same_kind")
    else:
        for x in xs:
            np.add(x, alpha * ys, out=x, casting="same_kind")


def mul_(xs: Sequence[np.ndarray], s: Any) -> None:
    for x, si in zip(xs, _each(s, len(xs))):
        np.multiply(x, si, out=x, casting="same_kind")


def lerp_(xs: Sequence[np.ndarray], ys: Sequence[Any], w: Any) -> None:
    for x, y in zip(xs, ys):
        np.add(x, w * (y - x), out=x, casting="same_kind")


def addcmul_(xs: Sequence[np.ndarray], ys: Sequence[Any], zs: Sequence[Any],
             value: Any = 1.0) -> None:
    for x, y, z in zip(xs, ys, zs):
        np.add(x, value * (y * z), out=x, casting="same_kind")


def addcdiv_(xs: Sequence[np.ndarray], ys: Sequence[Any], zs: Sequence[Any],
             value: Any = 1.0) -> None:
    for x, y, z in zip(xs, ys, zs):
        np.add(x, value * (y / z), out=x, casting="same_kind")


def no_grad() -> contextlib.nullcontext[None]:
    return contextlib.nullcontext()
