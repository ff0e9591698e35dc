"""The optimizer ops on JAX: pure jnp functions, traced into the JAX trainer's jitted step.

JAX arrays are immutable, so every in-place op replaces the list entry with the new value (cast
to the entry's dtype); the trainer reads the lists back after the update. The counter is a box
whose value is replaced in the same way. Contract: d500/training/optimizers/ops/__init__.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

name = "jax"
immutable = True  # Optimizer.step writes the replaced parameters back into its dict


class Counter:
    """A step counter: a 0-d int32 JAX array in a box (the box's value is replaced)."""

    __slots__ = ("n",)

    def __init__(self, n: Any = 0) -> None:
        self.n = jnp.asarray(n, jnp.int32)


def _each(s: Any, n: int) -> Sequence[Any]:
    return s if isinstance(s, (list, tuple)) else [s] * n


def _set(xs: list[Any], i: int, value: Any) -> None:
    xs[i] = jnp.asarray(value).astype(jnp.asarray(xs[i]).dtype)


# -- creation ---------------------------------------------------------------------------------
def full_like(xs: Sequence[Any], value: float) -> list[Any]:
    return [jnp.full_like(x, value) for x in xs]


def zeros_like(xs: Sequence[Any]) -> list[Any]:
    return [jnp.zeros_like(x) for x in xs]


def vector(values: Sequence[float], like: Any) -> Any:
    return jnp.asarray(list(values), dtype=like.dtype)


def counter() -> Counter:
    return Counter()


def increment(c: Counter) -> Any:
    c.n = c.n + 1
    return c.n.astype(jnp.float32)


# -- functional -------------------------------------------------------------------------------
def add(xs: Sequence[Any], ys: Any, alpha: Any = 1.0) -> list[Any]:
    if isinstance(ys, (list, tuple)):
        return [(x + alpha * y).astype(x.dtype) for x, y in zip(xs, ys)]
    return [(x + alpha * ys).astype(x.dtype) for x in xs]


def mul(xs: Sequence[Any], s: Any) -> list[Any]:
    return [(x * si).astype(x.dtype) for x, si in zip(xs, _each(s, len(xs)))]


def div(xs: Sequence[Any], ys: Sequence[Any]) -> list[Any]:
    return [x / y for x, y in zip(xs, ys)]


def sqrt(xs: Sequence[Any]) -> list[Any]:
    return [jnp.sqrt(x) for x in xs]


def sign(xs: Sequence[Any]) -> list[Any]:
    return [jnp.sign(x) for x in xs]


def maximum(xs: Sequence[Any], ys: Sequence[Any]) -> list[Any]:
    return [jnp.maximum(x, y) for x, y in zip(xs, ys)]


def norm(xs: Sequence[Any]) -> list[Any]:
    return [jnp.sqrt(jnp.sum(jnp.square(x))) for x in xs]


def stack(scalars: Sequence[Any]) -> Any:
    return jnp.stack(list(scalars))


def unstack(v: Any) -> list[Any]:
    return list(v)


def where(c: Any, a: Any, b: Any) -> Any:
    a = jnp.asarray(a)
    return jnp.where(c, a, jnp.asarray(b, a.dtype))


def bias_correction(beta: float, t: Any) -> Any:
    """1 - beta**t in float64 where JAX's 64-bit types are on (the trainer's trace), as float32."""
    wide = jnp.float64 if jnp.asarray(0.0).dtype == jnp.float64 else jnp.float32
    return (1.0 - jnp.asarray(beta, wide) ** jnp.asarray(t, wide)).astype(jnp.float32)


# -- in place (the list entries are replaced) ---------------------------------------------------
def assign_(xs: list[Any], ys: Sequence[Any]) -> None:
    for i, y in enumerate(ys):
        _set(xs, i, y)


def add_(xs: list[Any], ys: Any, alpha: Any = 1.0) -> None:
    for i, y in enumerate(_each(ys, len(xs))):
        _set(xs, i, xs[i] + alpha * y)


def mul_(xs: list[Any], s: Any) -> None:
    for i, si in enumerate(_each(s, len(xs))):
        _set(xs, i, xs[i] * si)


def lerp_(xs: list[Any], ys: Sequence[Any], w: Any) -> None:
    for i, y in enumerate(ys):
        _set(xs, i, xs[i] + w * (y - xs[i]))


def addcmul_(xs: list[Any], ys: Sequence[Any], zs: Sequence[Any], value: Any = 1.0) -> None:
    for i, (y, z) in enumerate(zip(ys, zs)):
        _set(xs, i, xs[i] + value * (y * z))


def addcdiv_(xs: list[Any], ys: Sequence[Any], zs: Sequence[Any], value: Any = 1.0) -> None:
    for i, (y, z) in enumerate(zip(ys, zs)):
        _set(xs, i, xs[i] + value * (y / z))


def no_grad() -> contextlib.nullcontext[None]:
    return contextlib.nullcontext()
