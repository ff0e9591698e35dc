"""NumPy backward (vector-Jacobian products) of ONNX operators, one small function per op.

A VJP function gets a `Step` (the node's attributes, opset, forward inputs `x` and outputs `y`)
and the gradients of the node's outputs `g` (None where an output received none), and returns
the gradients of its inputs (None for inputs that are not differentiable, e.g. shapes, indices).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

Grad = np.ndarray | None


@dataclass
class Step:
    """One executed node as its VJP sees it."""

    node: onnx.NodeProto
    opset: int
    x: list[Any]  # forward inputs (None for a missing optional input)
    y: list[Any]  # forward outputs
    attrs: dict[str, Any]

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)


def attributes(node: onnx.NodeProto) -> dict[str, Any]:
    out = {}
    for a in node.attribute:
        value = helper.get_attribute_value(a)
        out[a.name] = value.decode() if isinstance(value, bytes) else value
    return out


def unbroadcast(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum `g` over the axes NumPy broadcasting added or stretched to reach it from `shape`."""
    g = np.asarray(g)
    extra = g.ndim - len(shape)
    if extra > 0:
        g = g.sum(axis=tuple(range(extra)))
    stretched = tuple(i for i, d in enumerate(shape) if d == 1 and g.shape[i] != 1)
    if stretched:
        g = g.sum(axis=stretched, keepdims=True)
    return g.reshape(shape)


def _like(g: np.ndarray, x: np.ndarray) -> np.ndarray:
    return np.asarray(g, dtype=x.dtype)


# -- elementwise ------------------------------------------------------------------------
def Identity(s: Step, g: list[Grad]) -> list[Grad]:
    return [g[0]]


def Dropout(s: Step, g: list[Grad]) -> list[Grad]:
    x, ratio = s.x[0], (s.x[1] if len(s.x) > 1 and s.x[1] is not None else s.attr("ratio", .5))
    training = len(s.x) > 2 and s.x[2] is not None and bool(s.x[2])
    if training and len(s.y) > 1 and float(ratio) > 0:
        return [_like(g[0] * s.y[1] / (1.0 - float(ratio)), x)] + [None] * (len(s.x) - 1)
    return [g[0]] + [None] * (len(s.x) - 1)


def Relu(s: Step, g: list[Grad]) -> list[Grad]:
    return [_like(g[0] * (s.x[0] > 0), s.x[0])]


def LeakyRelu(s: Step, g: list[Grad]) -> list[Grad]:
    x = s.x[0]
    return [_like(np.where(x > 0, g[0], g[0] * s.attr("alpha", 0.01)), x)]


def Sigmoid(s: Step, g: list[Grad]) -> list[Grad]:
    y = s.y[0]
    return [_like(g[0] * y * (1 - y), y)]


def Tanh(s: Step, g: list[Grad]) -> list[Grad]:
    y = s.y[0]
    return [_like(g[0] * (1 - y * y), y)]


def Elu(s: Step, g: list[Grad]) -> list[Grad]:
    x, alpha = s.x[0], s.attr("alpha", 1.0)
    return [_like(g[0] * np.where(x > 0, 1, alpha * np.exp(np.minimum(x, 0))), x)]


def Selu(s: Step, g: list[Grad]) -> list[Grad]:
    x = s.x[0]
    alpha, gamma = s.attr("alpha", 1.67326319217681884765625), s.attr(
        "gamma", 1.05070102214813232421875)
    return [_like(g[0] * gamma * np.where(x > 0, 1, alpha * np.exp(np.minimum(x, 0))), x)]


def Celu(s: Step, g: list[Grad]) -> list[Grad]:
    x, alpha = s.x[0], s.attr("alpha", 1.0)
    return [_like(g[0] * np.where(x > 0, 1, np.exp(np.minimum(x, 0) / alpha)), x)]


def Softplus(s: Step, g: list[Grad]) -> list[Grad]:
    x = s.x[0]
    return [_like(g[0] / (1 + np.exp(-x)), x)]


def PRelu(s: Step, g: list[Grad]) -> list[Grad]:
    x, slope = s.x
    return [_like(np.where(x > 0, g[0], g[0] * slope), x),
            _like(unbroadcast(np.where(x > 0, 0, g[0] * x), slope.shape), slope)]


def HardSigmoid(s: Step, g: list[Grad]) -> list[Grad]:
    x, alpha, beta = s.x[0], s.attr("alpha", 0.2), s.attr("beta", 0.5)
    inside = (alpha * x + beta > 0) & (alpha * x + beta < 1)
    return [_like(g[0] * alpha * inside, x)]


def HardSwish(s: Step, g: list[Grad]) -> list[Grad]:
    x = s.x[0]
    return [_like(g[0] * np.where(x > 3, 1, np.where(x < -3, 0, (2 * x + 3) / 6)), x)]


def Erf(s: Step, g: list[Grad]) -> list[Grad]:
    x = s.x[0]
    return [_like(g[0] * 2 / np.sqrt(np.pi) * np.exp(-x * x), x)]


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
    return [_like(g[0] * d, x)]


def Sin(s: Step, g: list[Grad]) -> list[Grad]:
    return [_like(g[0] * np.cos(s.x[0]), s.x[0])]


def Cos(s: Step, g: list[Grad]) -> list[Grad]:
    return [_like(-g[0] * np.sin(s.x[0]), s.x[0])]


def _pick(s: Step, g: list[Grad]) -> list[Grad]:
    """Max/Min: the first input holding the selected value gets the gradient."""
    y, taken = s.y[0], np.zeros(s.y[0].shape, dtype=bool)
    out = []
    for x in s.x:
        hit = (np.broadcast_to(x, y.shape) == y) & ~taken
        taken |= hit
        out.append(_like(unbroadcast(np.where(hit, g[0], 0), x.shape), x))
    return out


Max = Min = _pick


def Exp(s: Step, g: list[Grad]) -> list[Grad]:
    return [_like(g[0] * s.y[0], s.y[0])]


def Log(s: Step, g: list[Grad]) -> list[Grad]:
    return [_like(g[0] / s.x[0], s.x[0])]


def Sqrt(s: Step, g: list[Grad]) -> list[Grad]:
    return [_like(g[0] / (2 * s.y[0]), s.y[0])]


def Reciprocal(s: Step, g: list[Grad]) -> list[Grad]:
    return [_like(-g[0] * s.y[0] * s.y[0], s.y[0])]


def Neg(s: Step, g: list[Grad]) -> list[Grad]:
    return [-g[0]]


def Abs(s: Step, g: list[Grad]) -> list[Grad]:
    return [_like(g[0] * np.sign(s.x[0]), s.x[0])]


def Clip(s: Step, g: list[Grad]) -> list[Grad]:
    x = s.x[0]
    if s.opset < 11:
        lo, hi = s.attr("min", -np.inf), s.attr("max", np.inf)
    else:
        lo = s.x[1] if len(s.x) > 1 and s.x[1] is not None else -np.inf
        hi = s.x[2] if len(s.x) > 2 and s.x[2] is not None else np.inf
    inside = (x >= lo) & (x <= hi)
    out: list[Grad] = [_like(g[0] * inside, x)]
    if s.opset >= 11:  # the bounds are inputs: they receive the clipped elements' gradients
        for bound, clipped in ((1, x < lo), (2, x > hi)):
            if len(s.x) > bound and s.x[bound] is not None:
                out.append(_like(np.sum(g[0] * clipped), s.x[bound]))
    return out


def Cast(s: Step, g: list[Grad]) -> list[Grad]:
    x = s.x[0]
    if np.asarray(x).dtype.kind != "f":
        return [None]
    return [_like(g[0], x)]


def Add(s: Step, g: list[Grad]) -> list[Grad]:
    a, b = s.x
    return [unbroadcast(g[0], a.shape), unbroadcast(g[0], b.shape)]


def Sub(s: Step, g: list[Grad]) -> list[Grad]:
    a, b = s.x
    return [unbroadcast(g[0], a.shape), unbroadcast(-g[0], b.shape)]


def Mul(s: Step, g: list[Grad]) -> list[Grad]:
    a, b = s.x
    return [unbroadcast(g[0] * b, a.shape), unbroadcast(g[0] * a, b.shape)]


def Div(s: Step, g: list[Grad]) -> list[Grad]:
    a, b = s.x
    return [unbroadcast(g[0] / b, a.shape), unbroadcast(-g[0] * a / (b * b), b.shape)]


def Pow(s: Step, g: list[Grad]) -> list[Grad]:
    a, b = s.x
    ga = g[0] * b * np.power(a, b - 1)
    gb = g[0] * s.y[0] * np.log(np.where(a > 0, a, 1)) if np.asarray(b).dtype.kind == "f" else None
    return [_like(unbroadcast(ga, a.shape), a),
            None if gb is None else _like(unbroadcast(gb, b.shape), b)]


def Sum(s: Step, g: list[Grad]) -> list[Grad]:
    return [unbroadcast(g[0], x.shape) for x in s.x]


def Mean(s: Step, g: list[Grad]) -> list[Grad]:
    return [_like(unbroadcast(g[0] / len(s.x), x.shape), x) for x in s.x]


def Where(s: Step, g: list[Grad]) -> list[Grad]:
    c, a, b = s.x
    return [None, unbroadcast(np.where(c, g[0], 0), a.shape),
            unbroadcast(np.where(c, 0, g[0]), b.shape)]


# -- linear algebra -----------------------------------------------------------------------
def MatMul(s: Step, g: list[Grad]) -> list[Grad]:
    a, b = s.x
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    g2 = np.asarray(g[0])
    if a.ndim == 1:
        g2 = np.expand_dims(g2, -2)
    if b.ndim == 1:
        g2 = np.expand_dims(g2, -1)
    ga = g2 @ np.swapaxes(b2, -1, -2)
    gb = np.swapaxes(a2, -1, -2) @ g2
    ga = unbroadcast(ga, a2.shape).reshape(a.shape)
    gb = unbroadcast(gb, b2.shape).reshape(b.shape)
    return [ga, gb]


def Gemm(s: Step, g: list[Grad]) -> list[Grad]:
    a, b = s.x[0], s.x[1]
    c = s.x[2] if len(s.x) > 2 else None
    alpha, beta = s.attr("alpha", 1.0), s.attr("beta", 1.0)
    am = a.T if s.attr("transA", 0) else a
    bm = b.T if s.attr("transB", 0) else b
    gy = np.asarray(g[0])
    ga = alpha * gy @ bm.T
    gb = alpha * am.T @ gy
    out: list[Grad] = [_like(ga.T if s.attr("transA", 0) else ga, a),
                       _like(gb.T if s.attr("transB", 0) else gb, b)]
    if c is not None:
        out.append(_like(unbroadcast(beta * gy, c.shape), c))
    return out


# -- convolution and pooling -------------------------------------------------------------
def _window(s: Step, x: np.ndarray, y: np.ndarray, kernel: list[int]
            ) -> tuple[list[int], list[int], list[int], list[int]]:
    """strides, dilations, begin pads and end pads (end pads cover ceil_mode and SAME_*)."""
    n = len(kernel)
    strides = list(s.attr("strides", [1] * n))
    dil = list(s.attr("dilations", [1] * n))
    auto = s.attr("auto_pad", "NOTSET")
    begin, end = [], []
    pads = list(s.attr("pads", [0] * 2 * n))
    for i in range(n):
        size, out = x.shape[2 + i], y.shape[2 + i]
        need = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 - size)
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            lo = need // 2 if auto == "SAME_UPPER" else need - need // 2
        elif auto == "VALID":
            lo = 0
        else:
            lo = pads[i]
        begin.append(lo)
        end.append(max(need - lo, pads[n + i] if auto == "NOTSET" else 0))
    return strides, dil, begin, end


def _slices(offset: list[int], dil: list[int], strides: list[int], out: tuple[int, ...]
            ) -> tuple[slice, ...]:
    """The positions of a padded input that kernel offset `offset` reads for every output."""
    return (slice(None), slice(None)) + tuple(
        slice(o * d, o * d + (n - 1) * st + 1, st)
        for o, d, st, n in zip(offset, dil, strides, out))


def Conv(s: Step, g: list[Grad]) -> list[Grad]:
    x, w = s.x[0], s.x[1]
    b = s.x[2] if len(s.x) > 2 else None
    y, gy = s.y[0], np.asarray(g[0])
    kernel = list(w.shape[2:])
    strides, dil, begin, end = _window(s, x, y, kernel)
    groups = s.attr("group", 1)
    xp = np.pad(x, [(0, 0), (0, 0)] + list(zip(begin, end)))
    gxp = np.zeros_like(xp)
    gw = np.zeros_like(w)
    n, c_in = x.shape[:2]
    c_out = w.shape[0]
    cg, og = c_in // groups, c_out // groups
    gyg = gy.reshape(n, groups, og, -1)  # n g og P (P: output positions)
    wg = w.reshape(groups, og, cg, *kernel)
    for offset in itertools.product(*(range(k) for k in kernel)):
        where = _slices(list(offset), dil, strides, y.shape[2:])
        patch = xp[where].reshape(n, groups, cg, -1)
        wk = wg[(slice(None),) * 3 + offset]  # g og cg
        gw[(slice(None), slice(None)) + offset] = np.einsum(
            "ngop,ngcp->goc", gyg, patch).reshape(c_out, cg)
        gxp[where] += np.einsum("ngop,goc->ngcp", gyg, wk).reshape(n, c_in, *y.shape[2:])
    spatial = tuple(slice(lo, lo + size) for lo, size in zip(begin, x.shape[2:]))
    out: list[Grad] = [gxp[(slice(None), slice(None)) + spatial], gw]
    if b is not None:
        out.append(_like(gy.sum(axis=(0, *range(2, gy.ndim))), b))
    return out


def MaxPool(s: Step, g: list[Grad]) -> list[Grad]:
    x, y, gy = s.x[0], s.y[0], np.asarray(g[0])
    kernel = list(s.attr("kernel_shape"))
    strides, dil, begin, end = _window(s, x, y, kernel)
    xp = np.pad(x, [(0, 0), (0, 0)] + list(zip(begin, end)), constant_values=-np.inf)
    gxp = np.zeros_like(xp)
    taken = np.zeros(y.shape, dtype=bool)  # the first maximum of each window gets the gradient
    for offset in itertools.product(*(range(k) for k in kernel)):
        where = _slices(list(offset), dil, strides, y.shape[2:])
        hit = (xp[where] == y) & ~taken
        taken |= hit
        gxp[where] += np.where(hit, gy, 0)
    spatial = tuple(slice(lo, lo + size) for lo, size in zip(begin, x.shape[2:]))
    return [gxp[(slice(None), slice(None)) + spatial]]


def AveragePool(s: Step, g: list[Grad]) -> list[Grad]:
    x, y, gy = s.x[0], s.y[0], np.asarray(g[0])
    kernel = list(s.attr("kernel_shape"))
    strides, dil, begin, end = _window(s, x, y, kernel)
    n = len(kernel)
    # Which padded positions count towards a window's divisor.
    counted = np.ones(x.shape[2:], dtype=x.dtype)
    auto = s.attr("auto_pad", "NOTSET")
    pads = list(s.attr("pads", [0] * 2 * n))
    # ceil_mode's extra end padding never counts; explicit and SAME_* padding may.
    stated = [min(e, pads[n + i]) if auto == "NOTSET" else e for i, e in enumerate(end)]
    if s.attr("count_include_pad", 0):
        counted = np.pad(counted, list(zip(begin, stated)), constant_values=1)
        counted = np.pad(counted, [(0, e - st) for e, st in zip(end, stated)])
    else:
        counted = np.pad(counted, list(zip(begin, end)))
    counted = counted[None, None]
    divisor = np.zeros((1, 1, *y.shape[2:]), dtype=x.dtype)
    for offset in itertools.product(*(range(k) for k in kernel)):
        divisor += counted[_slices(list(offset), dil, strides, y.shape[2:])]
    share = gy / np.maximum(divisor, 1)
    gxp = np.zeros((*x.shape[:2], *[a + b + c for a, b, c in zip(x.shape[2:], begin, end)]),
                   dtype=x.dtype)
    for offset in itertools.product(*(range(k) for k in kernel)):
        where = _slices(list(offset), dil, strides, y.shape[2:])
        gxp[where] += share * counted[where]
    spatial = tuple(slice(lo, lo + size) for lo, size in zip(begin, x.shape[2:]))
    return [gxp[(slice(None), slice(None)) + spatial]]


def GlobalAveragePool(s: Step, g: list[Grad]) -> list[Grad]:
    x = s.x[0]
    count = int(np.prod(x.shape[2:]))
    return [_like(np.broadcast_to(np.asarray(g[0]) / count, x.shape), x)]


def GlobalMaxPool(s: Step, g: list[Grad]) -> list[Grad]:
    x, y = s.x[0], s.y[0]
    hit = x == y
    first = np.cumsum(hit.reshape(*x.shape[:2], -1), axis=-1).reshape(x.shape) == 1
    return [_like(np.where(hit & first, g[0], 0), x)]


def BatchNormalization(s: Step, g: list[Grad]) -> list[Grad]:
    x, scale, bias, mean, var = s.x[:5]
    eps = s.attr("epsilon", 1e-5)
    axes = (0, *range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    gy = np.asarray(g[0])
    if s.attr("training_mode", 0):
        m = x.mean(axis=axes)
        v = x.var(axis=axes)
        inv = 1 / np.sqrt(v + eps)
        xhat = (x - m.reshape(shape)) * inv.reshape(shape)
        count = x.size / x.shape[1]
        gxhat = gy * scale.reshape(shape)
        gx = inv.reshape(shape) / count * (
            count * gxhat - gxhat.sum(axis=axes).reshape(shape)
            - xhat * (gxhat * xhat).sum(axis=axes).reshape(shape))
        return [_like(gx, x), _like((gy * xhat).sum(axis=axes), scale),
                _like(gy.sum(axis=axes), bias), None, None]
    inv = 1 / np.sqrt(var + eps)
    xhat = (x - mean.reshape(shape)) * inv.reshape(shape)
    gsum = gy.sum(axis=axes)
    gxhat_sum = (gy * xhat).sum(axis=axes)
    return [_like(gy * (scale * inv).reshape(shape), x), _like(gxhat_sum, scale),
            _like(gsum, bias), _like(-gsum * scale * inv, mean),
            _like(-0.5 * gxhat_sum * scale / (var + eps), var)]


def InstanceNormalization(s: Step, g: list[Grad]) -> list[Grad]:
    x, scale, bias = s.x
    eps = s.attr("epsilon", 1e-5)
    axes = tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    gy = np.asarray(g[0])
    mean = x.mean(axis=axes, keepdims=True)
    inv = 1 / np.sqrt(x.var(axis=axes, keepdims=True) + eps)
    xhat = (x - mean) * inv
    count = int(np.prod(x.shape[2:]))
    gxhat = gy * scale.reshape(shape)
    gx = inv / count * (count * gxhat - gxhat.sum(axis=axes, keepdims=True)
                        - xhat * (gxhat * xhat).sum(axis=axes, keepdims=True))
    return [_like(gx, x), _like((gy * xhat).sum(axis=(0, *axes)), scale),
            _like(gy.sum(axis=(0, *axes)), bias)]


def _channel_sums(a: np.ndarray, before: int, after: int) -> np.ndarray:
    """For each channel c, the sum of `a` over channels c-before .. c+after (zero outside)."""
    pad = np.pad(a, [(0, 0), (before, after)] + [(0, 0)] * (a.ndim - 2))
    cs = np.cumsum(pad, axis=1)
    cs = np.concatenate([np.zeros_like(cs[:, :1]), cs], axis=1)
    c = a.shape[1]
    return cs[:, before + after + 1:before + after + 1 + c] - cs[:, :c]


def LRN(s: Step, g: list[Grad]) -> list[Grad]:
    x, gy = s.x[0], np.asarray(g[0])
    size = s.attr("size")
    alpha, beta, bias = s.attr("alpha", 1e-4), s.attr("beta", 0.75), s.attr("bias", 1.0)
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    d = bias + alpha / size * _channel_sums(x * x, lo, hi)
    back = _channel_sums(gy * x * d ** (-beta - 1), hi, lo)  # the windows holding channel c
    return [_like(gy * d ** -beta - 2 * alpha / size * beta * x * back, x)]


# -- softmax and losses ------------------------------------------------------------------
def _softmax_axis(s: Step, x: np.ndarray) -> tuple[np.ndarray | None, int]:
    """Before opset 13 Softmax works on the input coerced to 2-D at `axis`."""
    if s.opset < 13:
        axis = s.attr("axis", 1) % x.ndim
        return (int(np.prod(x.shape[:axis])), -1), 1
    return None, s.attr("axis", -1)


def Softmax(s: Step, g: list[Grad]) -> list[Grad]:
    y, gy = s.y[0], np.asarray(g[0])
    shape, axis = _softmax_axis(s, y)
    y2, g2 = (y, gy) if shape is None else (y.reshape(shape), gy.reshape(shape))
    gx = y2 * (g2 - (g2 * y2).sum(axis=axis, keepdims=True))
    return [_like(gx.reshape(y.shape), y)]


def LogSoftmax(s: Step, g: list[Grad]) -> list[Grad]:
    y, gy = s.y[0], np.asarray(g[0])
    shape, axis = _softmax_axis(s, y)
    y2, g2 = (y, gy) if shape is None else (y.reshape(shape), gy.reshape(shape))
    gx = g2 - np.exp(y2) * g2.sum(axis=axis, keepdims=True)
    return [_like(gx.reshape(y.shape), y)]


def SoftmaxCrossEntropyLoss(s: Step, g: list[Grad]) -> list[Grad]:
    scores, labels = s.x[0], s.x[1]
    weights = s.x[2] if len(s.x) > 2 else None
    ignore = s.attr("ignore_index")
    reduction = s.attr("reduction", "mean")
    shifted = scores - scores.max(axis=1, keepdims=True)
    p = np.exp(shifted)
    p /= p.sum(axis=1, keepdims=True)
    valid = np.ones(labels.shape, dtype=scores.dtype) if ignore is None else (
        labels != ignore).astype(scores.dtype)
    safe = np.where(labels == ignore, 0, labels) if ignore is not None else labels
    w = valid if weights is None else valid * weights[safe]
    onehot = np.moveaxis(np.eye(scores.shape[1], dtype=scores.dtype)[safe], -1, 1)
    gx = np.zeros_like(scores)
    gw = None if weights is None else np.zeros_like(weights)
    if g[0] is not None:
        gl = np.asarray(g[0], dtype=scores.dtype)
        nll = -np.log(np.take_along_axis(p, np.expand_dims(safe, 1), axis=1)[:, 0]) * valid
        if reduction in ("none", "sum"):
            per = gl * w
            per_w = gl * nll
        else:
            denom = w.sum() if (weights is not None or ignore is not None) else w.size
            per = gl * w / denom
            per_w = gl * (nll - (w * nll).sum() / denom) / denom
        gx += np.expand_dims(per, 1) * (p - onehot)
        if gw is not None:  # each class weight scales the samples of that class
            np.add.at(gw, safe.ravel(), (per_w * valid).ravel())
    if len(g) > 1 and g[1] is not None:
        glp = np.asarray(g[1])
        gx += glp - p * glp.sum(axis=1, keepdims=True)
    return [gx, None] + ([gw] if len(s.x) > 2 else [])


# -- shapes and data movement ------------------------------------------------------------
def _reshape_back(s: Step, g: list[Grad]) -> list[Grad]:
    return [np.asarray(g[0]).reshape(s.x[0].shape)] + [None] * (len(s.x) - 1)


Reshape = Flatten = Squeeze = Unsqueeze = _reshape_back


def Transpose(s: Step, g: list[Grad]) -> list[Grad]:
    perm = s.attr("perm") or list(range(s.x[0].ndim))[::-1]
    return [np.transpose(g[0], np.argsort(perm))]


def Concat(s: Step, g: list[Grad]) -> list[Grad]:
    axis = s.attr("axis") % s.y[0].ndim
    cuts = np.cumsum([x.shape[axis] for x in s.x])[:-1]
    return list(np.split(np.asarray(g[0]), cuts, axis=axis))


def Expand(s: Step, g: list[Grad]) -> list[Grad]:
    return [unbroadcast(g[0], s.x[0].shape), None]


def _reduce_axes(s: Step) -> tuple[int, ...] | None:
    """The reduced axes (None: nothing reduced); attribute or second input by opset."""
    x = s.x[0]
    axes = s.x[1] if len(s.x) > 1 and s.x[1] is not None else s.attr("axes")
    if axes is None or len(axes) == 0:
        if s.attr("noop_with_empty_axes", 0):
            return None
        return tuple(range(x.ndim))
    return tuple(sorted(int(a) % x.ndim for a in np.asarray(axes).ravel()))


def _reduce_back(s: Step, g: np.ndarray) -> tuple[np.ndarray, int]:
    x = s.x[0]
    axes = _reduce_axes(s)
    if axes is None:
        return np.asarray(g), 1
    g = np.asarray(g)
    if not s.attr("keepdims", 1):
        g = np.expand_dims(g, axes)
    return np.broadcast_to(g, x.shape), int(np.prod([x.shape[a] for a in axes]))


def ReduceSum(s: Step, g: list[Grad]) -> list[Grad]:
    gx, _ = _reduce_back(s, g[0])
    return [_like(gx, s.x[0])] + [None] * (len(s.x) - 1)


def ReduceMean(s: Step, g: list[Grad]) -> list[Grad]:
    gx, count = _reduce_back(s, g[0])
    return [_like(gx / count, s.x[0])] + [None] * (len(s.x) - 1)


def _route(s: Step, g: list[Grad]) -> list[Grad]:
    """Gradient of a pure data-movement op (Slice, Gather, Pad, Tile, Split, ...).

    The op is run on a tensor of (1 + element index) in place of its first input; each output
    element then names the input element it copies (0: a padding value), and the output
    gradients are scattered back through those indices.
    """
    from onnx.reference import ReferenceEvaluator

    from d500.backends.base import node_model
    x = s.x[0]
    index = np.arange(1, x.size + 1, dtype=np.int64).reshape(x.shape)
    others = list(s.x[1:])
    if s.node.op_type == "Pad" and len(others) > 1 and others[1] is not None:
        others[1] = np.zeros((), dtype=np.int64)  # constant_value: "not from x"
    node = onnx.NodeProto()
    node.CopyFrom(s.node)
    names = [f"in{i}" if n else "" for i, n in enumerate(node.input)]
    del node.input[:]
    node.input.extend(names)
    values = [v for v, n in zip([index, *others], names) if n]
    if node.op_type == "Pad" and s.attr("value") is not None:
        for a in node.attribute:
            if a.name == "value":
                a.f = 0.0
    routes = ReferenceEvaluator(node_model(node, values, opset=s.opset)).run(
        None, {n: v for n, v in zip([n for n in names if n], values)})
    gx = np.zeros(x.size, dtype=x.dtype)
    for r, gy in zip(routes, g):
        if gy is None:
            continue
        r = np.asarray(r).ravel()
        keep = r > 0
        np.add.at(gx, r[keep] - 1, np.asarray(gy, dtype=x.dtype).ravel()[keep])
    return [gx.reshape(x.shape)] + [None] * (len(s.x) - 1)


Slice = Gather = Pad = Tile = Split = DepthToSpace = SpaceToDepth = _route


VJP: dict[str, Callable[[Step, list[Grad]], list[Grad]]] = {
    name: globals()[name] for name in (
        "Identity", "Dropout", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt",
        "Reciprocal", "Neg", "Abs", "Clip", "Cast", "Add", "Sub", "Mul", "Div", "Pow", "Sum",
        "Mean", "Where", "MatMul", "Gemm", "Conv", "MaxPool", "AveragePool",
        "GlobalAveragePool", "GlobalMaxPool", "BatchNormalization", "Softmax", "LogSoftmax",
        "SoftmaxCrossEntropyLoss", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose",
        "Concat", "Expand", "ReduceSum", "ReduceMean", "Slice", "Gather", "Pad", "Tile",
        "Split", "DepthToSpace", "SpaceToDepth", "Elu", "Selu", "Celu", "Softplus", "PRelu",
        "HardSigmoid", "HardSwish", "Erf", "Gelu", "Sin", "Cos", "Max", "Min",
        "InstanceNormalization", "LRN",
    )
}
