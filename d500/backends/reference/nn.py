"""NumPy VJPs of the network operators: MatMul/Gemm, convolution, pooling, normalization,
softmax and losses."""

from __future__ import annotations

import itertools

import numpy as np

from d500.backends.graph import registry
from d500.backends.reference.table import Grad, Step, like, unbroadcast

VJP, op = registry()


@op
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


@op
def Gemm(s: Step, g: list[Grad]) -> list[Grad]:
    a, b = s.x[0], s.x[1]
    c = s.x[2] if len(s.x) > 2 else None
    alpha, beta = s.attr("alpha", 1.0), s.attr("beta", 1.0)
    am = a.T if s.attr("transA", 0) else a
    bm = b.T if s.attr("transB", 0) else b
    gy = np.asarray(g[0])
    ga = alpha * gy @ bm.T
    gb = alpha * am.T @ gy
    out: list[Grad] = [like(ga.T if s.attr("transA", 0) else ga, a),
                       like(gb.T if s.attr("transB", 0) else gb, b)]
    if c is not None:
        out.append(like(unbroadcast(beta * gy, c.shape), c))
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


@op
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
        out.append(like(gy.sum(axis=(0, *range(2, gy.ndim))), b))
    return out


@op
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


@op
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


@op
def GlobalAveragePool(s: Step, g: list[Grad]) -> list[Grad]:
    x = s.x[0]
    count = int(np.prod(x.shape[2:]))
    return [like(np.broadcast_to(np.asarray(g[0]) / count, x.shape), x)]


@op
def GlobalMaxPool(s: Step, g: list[Grad]) -> list[Grad]:
    x, y = s.x[0], s.y[0]
    hit = x == y
    first = np.cumsum(hit.reshape(*x.shape[:2], -1), axis=-1).reshape(x.shape) == 1
    return [like(np.where(hit & first, g[0], 0), x)]


@op
def BatchNormalization(s: Step, g: list[Grad]) -> list[Grad]:
    x, scale, bias, mean, var = s.x[:5]
    eps = s.attr("epsilon", 1e-5)
    if s.opset < 9 and s.attr("spatial", 1) == 0:  # BN-7 spatial=0: (C, D1, ..., Dn) parameters
        axes, shape = (0,), (1, *x.shape[1:])
    else:
        axes, shape = (0, *range(2, x.ndim)), (1, -1) + (1,) * (x.ndim - 2)
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
        return [like(gx, x), like((gy * xhat).sum(axis=axes), scale),
                like(gy.sum(axis=axes), bias), None, None]
    scale, bias, mean, var = (v.reshape(shape[1:]) for v in (scale, bias, mean, var))
    inv = 1 / np.sqrt(var + eps)
    xhat = (x - mean) * inv
    gsum = gy.sum(axis=axes, keepdims=True)[0]
    gxhat_sum = (gy * xhat).sum(axis=axes, keepdims=True)[0]
    grads = [gy * (scale * inv), gxhat_sum, gsum, -gsum * scale * inv,
             -0.5 * gxhat_sum * scale / (var + eps)]
    return [like(np.reshape(d, v.shape), v) for d, v in zip(grads, s.x[:5])]


@op
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
    return [like(gx, x), like((gy * xhat).sum(axis=(0, *axes)), scale),
            like(gy.sum(axis=(0, *axes)), bias)]


def _channel_sums(a: np.ndarray, before: int, after: int) -> np.ndarray:
    """For each channel c, the sum of `a` over channels c-before .. c+after (zero outside)."""
    pad = np.pad(a, [(0, 0), (before, after)] + [(0, 0)] * (a.ndim - 2))
    cs = np.cumsum(pad, axis=1)
    cs = np.concatenate([np.zeros_like(cs[:, :1]), cs], axis=1)
    c = a.shape[1]
    return cs[:, before + after + 1:before + after + 1 + c] - cs[:, :c]


@op
def LRN(s: Step, g: list[Grad]) -> list[Grad]:
    x, gy = s.x[0], np.asarray(g[0])
    size = s.attr("size")
    alpha, beta, bias = s.attr("alpha", 1e-4), s.attr("beta", 0.75), s.attr("bias", 1.0)
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    d = bias + alpha / size * _channel_sums(x * x, lo, hi)
    back = _channel_sums(gy * x * d ** (-beta - 1), hi, lo)  # the windows holding channel c
    return [like(gy * d ** -beta - 2 * alpha / size * beta * x * back, x)]


# -- softmax and losses ------------------------------------------------------------------
def _softmax_axis(s: Step, x: np.ndarray) -> tuple[np.ndarray | None, int]:
    """Before opset 13 Softmax works on the input coerced to 2-D at `axis`."""
    if s.opset < 13:
        axis = s.attr("axis", 1) % x.ndim
        return (int(np.prod(x.shape[:axis])), -1), 1
    return None, s.attr("axis", -1)


@op
def Softmax(s: Step, g: list[Grad]) -> list[Grad]:
    y, gy = s.y[0], np.asarray(g[0])
    shape, axis = _softmax_axis(s, y)
    y2, g2 = (y, gy) if shape is None else (y.reshape(shape), gy.reshape(shape))
    gx = y2 * (g2 - (g2 * y2).sum(axis=axis, keepdims=True))
    return [like(gx.reshape(y.shape), y)]


@op
def LogSoftmax(s: Step, g: list[Grad]) -> list[Grad]:
    y, gy = s.y[0], np.asarray(g[0])
    shape, axis = _softmax_axis(s, y)
    y2, g2 = (y, gy) if shape is None else (y.reshape(shape), gy.reshape(shape))
    gx = g2 - np.exp(y2) * g2.sum(axis=axis, keepdims=True)
    return [like(gx.reshape(y.shape), y)]


@op
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
