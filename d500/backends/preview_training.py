"""The ai.onnx.preview.training optimizer operators (Adagrad, Adam, Momentum) written once over a
framework's few array functions (ONNX ops, not d500's level-2 training): torch and JAX register
them with their own `Arrays`.

Everything branches on values through `where`, never in Python, so the same formulas run on
eager tensors and inside a trace (JAX's jit, where the step count is not known)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Arrays:
    """A framework's functions the formulas need: sqrt(x), where(c, a, b) with scalars,
    wide(t) (a scalar as float64) and cast(x, like) (x in like's dtype)."""

    sqrt: Callable[[Any], Any]
    where: Callable[[Any, Any, Any], Any]
    wide: Callable[[Any], Any]
    cast: Callable[[Any, Any], Any]


def groups(values: tuple, parts: int) -> list[tuple]:
    """The variadic inputs (X..., G..., state...) split into `parts` equal groups."""
    n = len(values) // parts
    return [values[i * n:(i + 1) * n] for i in range(parts)]


def adagrad(a: Arrays, node: Any, rate: Any, step: Any, *tensors: Any) -> tuple:
    decay = node.attr("decay_factor", 0.0)
    eps, norm = node.attr("epsilon", 1e-6), node.attr("norm_coefficient", 0.0)
    r = rate / (1 + step * decay)
    xs, gs, hs = groups(tensors, 3)
    new_x, new_h = [], []
    for x, g, h in zip(xs, gs, hs):
        g = norm * x + g
        h = h + g * g
        new_x.append(a.cast(x - r * g / (a.sqrt(h) + eps), x))
        new_h.append(a.cast(h, x))
    return tuple(new_x + new_h)


def adam(a: Arrays, node: Any, rate: Any, step: Any, *tensors: Any) -> tuple:
    alpha, beta = node.attr("alpha", 0.9), node.attr("beta", 0.999)
    eps, norm = node.attr("epsilon", 1e-6), node.attr("norm_coefficient", 0.0)
    post = node.attr("norm_coefficient_post", 0.0)
    t = a.wide(step)
    safe = a.where(t > 0, t, 1.0)
    r = a.where(t > 0, rate * a.sqrt(1 - beta ** safe) / (1 - alpha ** safe), a.wide(rate))
    xs, gs, vs, hs = groups(tensors, 4)
    new_x, new_v, new_h = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs):
        g = norm * x + g
        v = alpha * v + (1 - alpha) * g
        h = beta * h + (1 - beta) * g * g
        new_x.append(a.cast((1 - post) * (x - r * v / (a.sqrt(h) + eps)), x))
        new_v.append(a.cast(v, x))
        new_h.append(a.cast(h, x))
    return tuple(new_x + new_v + new_h)


def momentum(a: Arrays, node: Any, rate: Any, step: Any, *tensors: Any) -> tuple:
    alpha, beta = node.attr("alpha"), node.attr("beta")
    norm, nesterov = node.attr("norm_coefficient", 0.0), node.attr("mode") == "nesterov"
    beta = a.where(a.wide(step) > 0, beta, 1.0)
    xs, gs, vs = groups(tensors, 3)
    new_x, new_v = [], []
    for x, g, v in zip(xs, gs, vs):
        g = norm * x + g
        v = alpha * v + beta * g
        direction = g + alpha * v if nesterov else v
        new_x.append(a.cast(x - rate * direction, x))
        new_v.append(a.cast(v, x))
    return tuple(new_x + new_v)


def register(op: Callable[[Callable], Any], a: Arrays) -> None:
    """Register Adagrad, Adam and Momentum on a backend's preview-training table."""
    for name, formula in (("Adagrad", adagrad), ("Adam", adam), ("Momentum", momentum)):
        def bound(node, *inputs, formula=formula):
            return formula(a, node, *inputs)
        op(bound, names=(name,))
