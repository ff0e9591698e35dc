"""Reductions and order statistics in torch: Reduce*, ArgMax/ArgMin, TopK, CumSum/CumProd."""

from __future__ import annotations

import math

import torch

from d500.backends.graph import registry
from d500.backends.torch.table import axis_of, ints

OPS, op = registry()


def _reduce(node, x, axes, fn, empty_fill):
    """Reduce `x` over the node's axes with `fn(x, dims, keepdim)`; ONNX's opset rules for axes."""
    axes = node.attr("axes") if axes is None else ints(axes)
    keep = bool(node.attr("keepdims", 1))
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            return x
        axes = list(range(x.dim()))
    dims = tuple(sorted(axis_of(a, x.dim()) for a in axes))
    if x.numel() == 0 or not dims:
        shape = [1 if i in dims else s for i, s in enumerate(x.shape)] if keep else [
            s for i, s in enumerate(x.shape) if i not in dims]
        if any(x.shape[d] == 0 for d in dims):
            return torch.full(shape, empty_fill(x.dtype), dtype=x.dtype, device=x.device)
    return fn(x, dims, keep)


def _lowest(dtype):
    return -math.inf if dtype.is_floating_point else (
        False if dtype == torch.bool else torch.iinfo(dtype).min)


def _highest(dtype):
    return math.inf if dtype.is_floating_point else (
        True if dtype == torch.bool else torch.iinfo(dtype).max)


def _as_float(fn):
    """Run a float-only reduction on an integer tensor in float64, cast back."""
    def run(x, dims, keep):
        if x.is_floating_point():
            return fn(x, dims, keep)
        return fn(x.to(torch.float64), dims, keep).to(x.dtype)
    return run


def _prod(x, dims, keep):
    for d in sorted(dims, reverse=True):
        x = x.prod(dim=d, keepdim=keep)
    return x


def _bool_safe(fn):
    def run(x, dims, keep):
        if x.dtype == torch.bool:
            return fn(x.to(torch.uint8), dims, keep).to(torch.bool)
        return fn(x, dims, keep)
    return run


@op
def ReduceSum(node, x, axes=None):
    return _reduce(node, x, axes, lambda t, d, k: t.sum(dim=d, keepdim=k).to(t.dtype),
                   lambda dt: 0)


@op
def ReduceMean(node, x, axes=None):
    return _reduce(node, x, axes, _as_float(lambda t, d, k: t.mean(dim=d, keepdim=k)),
                   lambda dt: math.nan)


@op
def ReduceMax(node, x, axes=None):
    return _reduce(node, x, axes, _bool_safe(lambda t, d, k: t.amax(dim=d, keepdim=k)),
                   _lowest)


@op
def ReduceMin(node, x, axes=None):
    return _reduce(node, x, axes, _bool_safe(lambda t, d, k: t.amin(dim=d, keepdim=k)),
                   _highest)


@op
def ReduceProd(node, x, axes=None):
    return _reduce(node, x, axes, _prod, lambda dt: 1)


@op
def ReduceL1(node, x, axes=None):
    return _reduce(node, x, axes, lambda t, d, k: t.abs().sum(dim=d, keepdim=k).to(t.dtype),
                   lambda dt: 0)


@op
def ReduceL2(node, x, axes=None):
    return _reduce(node, x, axes, _as_float(
        lambda t, d, k: t.square().sum(dim=d, keepdim=k).sqrt()), lambda dt: 0)


@op
def ReduceSumSquare(node, x, axes=None):
    return _reduce(node, x, axes, lambda t, d, k: t.square().sum(dim=d, keepdim=k).to(t.dtype),
                   lambda dt: 0)


@op
def ReduceLogSum(node, x, axes=None):
    return _reduce(node, x, axes, _as_float(lambda t, d, k: t.sum(dim=d, keepdim=k).log()),
                   lambda dt: -math.inf)


@op
def ReduceLogSumExp(node, x, axes=None):
    return _reduce(node, x, axes, _as_float(lambda t, d, k: torch.logsumexp(t, d, keepdim=k)),
                   lambda dt: -math.inf)


def _arg(node, x, pick):
    axis = axis_of(node.attr("axis", 0), x.dim())
    keep = bool(node.attr("keepdims", 1))
    if x.dtype == torch.bool:
        x = x.to(torch.uint8)
    if node.attr("select_last_index", 0):
        return x.shape[axis] - 1 - pick(x.flip(axis), axis, keep)
    return pick(x, axis, keep)


@op
def ArgMax(node, x):
    return _arg(node, x, lambda t, a, k: torch.argmax(t, a, keepdim=k))


@op
def ArgMin(node, x):
    return _arg(node, x, lambda t, a, k: torch.argmin(t, a, keepdim=k))


@op
def TopK(node, x, k=None):
    k = node.attr("k") if k is None else int(k.reshape(-1)[0].item())
    axis = axis_of(node.attr("axis", -1), x.dim())
    largest = bool(node.attr("largest", 1))
    values, indices = torch.sort(x, dim=axis, descending=largest, stable=True)
    return values.narrow(axis, 0, k), indices.narrow(axis, 0, k)


def _cumulative(node, x, axis, fn, identity):
    axis = axis_of(int(axis.reshape(-1)[0].item()), x.dim())
    reverse, exclusive = node.attr("reverse", 0), node.attr("exclusive", 0)
    if reverse:
        x = x.flip(axis)
    if exclusive:
        pad = torch.full_like(x.narrow(axis, 0, 1), identity)
        x = torch.cat([pad, x.narrow(axis, 0, x.shape[axis] - 1)], axis)
    y = fn(x, axis).to(x.dtype)
    return y.flip(axis) if reverse else y


@op
def CumSum(node, x, axis):
    return _cumulative(node, x, axis, torch.cumsum, 0)


@op
def CumProd(node, x, axis):
    return _cumulative(node, x, axis, torch.cumprod, 1)
