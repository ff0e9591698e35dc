"""NumPy VJPs of the elementwise operators (activations, unary math, arithmetic, Where)."""

from __future__ import annotations

import numpy as np

from d500.backends.graph import registry
from d500.backends.reference.table import Grad, Step, like, unbroadcast

VJP, op = registry()


@op
def Identity(s: Step, g: list[Grad]) -> list[Grad]:
    return [g[0]]


@op
def Dropout(s: Step, g: list[Grad]) -> list[Grad]:
    x, ratio = s.x[0], (s.x[1] if len(s.x) > 1 and s.x[1] is not None else s.attr("ratio", .5))
    training = len(s.x) > 2 and s.x[2] is not None and bool(s.x[2])
    if training and len(s.y) > 1 and float(ratio) > 0:
        return [like(g[0] * s.y[1] / (1.0 - float(ratio)), x)] + [None] * (len(s.x) - 1)
    return [g[0]] + [None] * (len(s.x) - 1)


@op
def Relu(s: Step, g: list[Grad]) -> list[Grad]:
    return [like(g[0] * (s.x[0] > 0), s.x[0])]


@op
def LeakyRelu(s: Step, g: list[Grad]) -> list[Grad]:
    x = s.x[0]
    return [like(np.where(x > 0, g[0], g[0] * s.attr("alpha", 0.01)), x)]


@op
def Sigmoid(s: Step, g: list[Grad]) -> list[Grad]:
    y = s.y[0]
    return [like(g[0] * y * (1 - y), y)]


@op
def Tanh(s: Step, g: list[Grad]) -> list[Grad]:
    y = s.y[0]
    return [like(g[0] * (1 - y * y), y)]


@op
def Elu(s: Step, g: list[Grad]) -> list[Grad]:
    x, alpha = s.x[0], s.attr("alpha", 1.0)
    return [like(g[0] * np.where(x > 0, 1, alpha * np.exp(np.minimum(x, 0))), x)]


@op
def Selu(s: Step, g: list[Grad]) -> list[Grad]:
    x = s.x[0]
    alpha, gamma = s.attr("alpha", 1.67326319217681884765625), s.attr(
        "gamma", 1.05070102214813232421875)
    return [like(g[0] * gamma * np.where(x > 0, 1, alpha * np.exp(np.minimum(x, 0))), x)]


@op
def Celu(s: Step, g: list[Grad]) -> list[Grad]:
    x, alpha = s.x[0], s.attr("alpha", 1.0)
    return [like(g[0] * np.where(x > 0, 1, np.exp(np.minimum(x, 0) / alpha)), x)]


@op
def Softplus(s: Step, g: list[Grad]) -> list[Grad]:
    x = s.x[0]
    return [like(g[0] / (1 + np.exp(-x)), x)]


@op
def PRelu(s: Step, g: list[Grad]) -> list[Grad]:
    x, slope = s.x
    return [like(np.where(x > 0, g[0], g[0] * slope), x),
            like(unbroadcast(np.where(x > 0, 0, g[0] * x), slope.shape), slope)]


@op
def HardSigmoid(s: Step, g: list[Grad]) -> list[Grad]:
    x, alpha, beta = s.x[0], s.attr("alpha", 0.2), s.attr("beta", 0.5)
    inside = (alpha * x + beta > 0) & (alpha * x + beta < 1)
    return [like(g[0] * alpha * inside, x)]


@op
def HardSwish(s: Step, g: list[Grad]) -> list[Grad]:
    x = s.x[0]
    return [like(g[0] * np.where(x > 3, 1, np.where(x < -3, 0, (2 * x + 3) / 6)), x)]


@op
def Erf(s: Step, g: list[Grad]) -> list[Grad]:
    x = s.x[0]
    return [like(g[0] * 2 / np.sqrt(np.pi) * np.exp(-x * x), x)]


@op
def Gelu(s: Step, g: list[Grad]) -> list[Grad]:
    x = s.x[0]
    if s.attr("approximate", "none") == "tanh":
        k = np.sqrt(2 / np.pi)
        t = np.tanh(k * (x + 0.044715 * x ** 3))
        d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x)
    else:
        from math import erf
        cdf = 0.5 * (1 + np.vectorize(erf, otypes=[x.dtype])(x / np.sqrt(2)))
        d = cdf + x * np.exp(-x * x / 2) / np.sqrt(2 * np.pi)
    return [like(g[0] * d, x)]


@op
def Sin(s: Step, g: list[Grad]) -> list[Grad]:
    return [like(g[0] * np.cos(s.x[0]), s.x[0])]


@op
def Cos(s: Step, g: list[Grad]) -> list[Grad]:
    return [like(-g[0] * np.sin(s.x[0]), s.x[0])]


@op(names=("Max", "Min"))
def _pick(s: Step, g: list[Grad]) -> list[Grad]:
    """Max/Min: the first input holding the selected value gets the gradient."""
    y, taken = s.y[0], np.zeros(s.y[0].shape, dtype=bool)
    out = []
    for x in s.x:
        hit = (np.broadcast_to(x, y.shape) == y) & ~taken
        taken |= hit
        out.append(like(unbroadcast(np.where(hit, g[0], 0), x.shape), x))
    return out


@op
def Exp(s: Step, g: list[Grad]) -> list[Grad]:
    return [like(g[0] * s.y[0], s.y[0])]


@op
def Log(s: Step, g: list[Grad]) -> list[Grad]:
    return [like(g[0] / s.x[0], s.x[0])]


@op
def Sqrt(s: Step, g: list[Grad]) -> list[Grad]:
    return [like(g[0] / (2 * s.y[0]), s.y[0])]


@op
def Reciprocal(s: Step, g: list[Grad]) -> list[Grad]:
    return [like(-g[0] * s.y[0] * s.y[0], s.y[0])]


@op
def Neg(s: Step, g: list[Grad]) -> list[Grad]:
    return [-g[0]]


@op
def Abs(s: Step, g: list[Grad]) -> list[Grad]:
    return [like(g[0] * np.sign(s.x[0]), s.x[0])]


@op
def Clip(s: Step, g: list[Grad]) -> list[Grad]:
    x = s.x[0]
    if s.opset < 11:
        lo, hi = s.attr("min", -np.inf), s.attr("max", np.inf)
    else:
        lo = s.x[1] if len(s.x) > 1 and s.x[1] is not None else -np.inf
        hi = s.x[2] if len(s.x) > 2 and s.x[2] is not None else np.inf
    inside = (x >= lo) & (x <= hi)
    out: list[Grad] = [like(g[0] * inside, x)]
    if s.opset >= 11:  # the bounds are inputs: they receive the clipped elements' gradients
        for bound, clipped in ((1, x < lo), (2, x > hi)):
            if len(s.x) > bound and s.x[bound] is not None:
                out.append(like(np.sum(g[0] * clipped), s.x[bound]))
    return out


@op
def Cast(s: Step, g: list[Grad]) -> list[Grad]:
    x = s.x[0]
    if np.asarray(x).dtype.kind != "f":
        return [None]
    return [like(g[0], x)]


@op
def Add(s: Step, g: list[Grad]) -> list[Grad]:
    a, b = s.x
    return [unbroadcast(g[0], a.shape), unbroadcast(g[0], b.shape)]


@op
def Sub(s: Step, g: list[Grad]) -> list[Grad]:
    a, b = s.x
    return [unbroadcast(g[0], a.shape), unbroadcast(-g[0], b.shape)]


@op
def Mul(s: Step, g: list[Grad]) -> list[Grad]:
    a, b = s.x
    return [unbroadcast(g[0] * b, a.shape), unbroadcast(g[0] * a, b.shape)]


@op
def Div(s: Step, g: list[Grad]) -> list[Grad]:
    a, b = s.x
    return [unbroadcast(g[0] / b, a.shape), unbroadcast(-g[0] * a / (b * b), b.shape)]


@op
def Pow(s: Step, g: list[Grad]) -> list[Grad]:
    a, b = s.x
    ga = g[0] * b * np.power(a, b - 1)
    gb = g[0] * s.y[0] * np.log(np.where(a > 0, a, 1)) if np.asarray(b).dtype.kind == "f" else None
    return [like(unbroadcast(ga, a.shape), a),
            None if gb is None else like(unbroadcast(gb, b.shape), b)]


@op
def Sum(s: Step, g: list[Grad]) -> list[Grad]:
    return [unbroadcast(g[0], x.shape) for x in s.x]


@op
def Mean(s: Step, g: list[Grad]) -> list[Grad]:
    return [like(unbroadcast(g[0] / len(s.x), x.shape), x) for x in s.x]


@op
def Where(s: Step, g: list[Grad]) -> list[Grad]:
    c, a, b = s.x
    return [None, unbroadcast(np.where(c, g[0], 0), a.shape),
            unbroadcast(np.where(c, 0, g[0]), b.shape)]
