"""The optimizer ops on torch tensors: one `torch._foreach_*` multi-tensor kernel call per op.

Scalars that are Python numbers go straight to the kernel; a 0-d tensor scalar (rare on torch:
the schedule gives Python floats) takes a multiply first, since `alpha=` only takes numbers.
Contract: d500/training/optimizers/ops/__init__.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Number
from typing import Any

import torch

name = "torch"

_foreach_add, _foreach_add_ = torch._foreach_add, torch._foreach_add_
_foreach_mul, _foreach_mul_ = torch._foreach_mul, torch._foreach_mul_


def _is_one(alpha: Any) -> bool:
    return isinstance(alpha, Number) and alpha == 1.0


class Counter:
    """A step counter: a Python int in a box (bias corrections stay in Python floats)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


# -- creation ---------------------------------------------------------------------------------
def full_like(xs: Sequence[torch.Tensor], value: float) -> list[torch.Tensor]:
    return [torch.full_like(x, value, memory_format=torch.preserve_format) for x in xs]


def zeros_like(xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.zeros_like(x, memory_format=torch.preserve_format) for x in xs]


def vector(values: Sequence[float], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(list(values), dtype=like.dtype, device=like.device)


def counter() -> Counter:
    return Counter()


def increment(c: Counter) -> int:
    c.n += 1
    return c.n


# -- functional -------------------------------------------------------------------------------
def add(xs: Sequence[Any], ys: Any, alpha: Any = 1.0) -> list[torch.Tensor]:
    if isinstance(ys, (list, tuple)):
        if isinstance(alpha, Number):
            return list(_foreach_add(xs, ys, alpha=alpha))
        return list(_foreach_add(xs, _foreach_mul(ys, alpha)))
    return list(_foreach_add(xs, ys if _is_one(alpha) else ys * alpha))


def mul(xs: Sequence[Any], s: Any) -> list[torch.Tensor]:
    return list(_foreach_mul(xs, list(s) if isinstance(s, tuple) else s))


def div(xs: Sequence[Any], ys: Sequence[Any]) -> list[torch.Tensor]:
    return list(torch._foreach_div(xs, ys))


def sqrt(xs: Sequence[Any]) -> list[torch.Tensor]:
    return list(torch._foreach_sqrt(xs))


def sign(xs: Sequence[Any]) -> list[torch.Tensor]:
    return list(torch._foreach_sign(xs))


def maximum(xs: Sequence[Any], ys: Sequence[Any]) -> list[torch.Tensor]:
    return list(torch._foreach_maximum(xs, ys))


def norm(xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return list(torch._foreach_norm(xs))


def stack(scalars: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.stack(list(scalars))


def unstack(v: torch.Tensor) -> list[torch.Tensor]:
    return list(v.unbind(0))


def where(c: Any, a: Any, b: Any) -> torch.Tensor:
    return torch.where(c, a, b)


def bias_correction(beta: float, t: int) -> float:
    return 1.0 - beta ** t


# -- in place ---------------------------------------------------------------------------------
def assign_(xs: Sequence[torch.Tensor], ys: Sequence[Any]) -> None:
    torch._foreach_copy_(xs, ys)


def add_(xs: Sequence[torch.Tensor], ys: Any, alpha: Any = 1.0) -> None:
    if isinstance(ys, (list, tuple)):
        if isinstance(alpha, Number):
            _foreach_add_(xs, ys, alpha=alpha)
        else:
            _foreach_add_(xs, _foreach_mul(ys, alpha))
    else:
        _foreach_add_(xs, ys if _is_one(alpha) else ys * alpha)


def mul_(xs: Sequence[torch.Tensor], s: Any) -> None:
    _foreach_mul_(xs, list(s) if isinstance(s, tuple) else s)


def lerp_(xs: Sequence[torch.Tensor], ys: Sequence[Any], w: Any) -> None:
    if isinstance(w, Number):
        torch._foreach_lerp_(xs, ys, w)
    else:
        _foreach_add_(xs, _foreach_mul(torch._foreach_sub(ys, xs), w))


def addcmul_(xs: Sequence[torch.Tensor], ys: Sequence[Any], zs: Sequence[Any],
             value: Any = 1.0) -> None:
    if isinstance(value, Number):
        torch._foreach_addcmul_(xs, ys, zs, value)
    else:
        torch._foreach_addcmul_(xs, _foreach_mul(ys, value), zs)


def addcdiv_(xs: Sequence[torch.Tensor], ys: Sequence[Any], zs: Sequence[Any],
             value: Any = 1.0) -> None:
    if isinstance(value, Number):
        torch._foreach_addcdiv_(xs, ys, zs, value)
    else:
        torch._foreach_addcdiv_(xs, _foreach_mul(ys, value), zs)


def no_grad() -> torch.no_grad:
    return torch.no_grad()
