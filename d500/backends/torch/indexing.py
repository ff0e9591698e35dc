"""Indexing torch ops: gathers, scatters, one-hot, masks, NonZero, Compress, ReverseSequence,
Unique, TensorScatter."""

from __future__ import annotations

import math

import numpy as np
import torch

from d500.backends import host_ops
from d500.backends.graph import registry
from d500.backends.torch import dtypes
from d500.backends.torch.table import axis_of, ints

OPS, op = registry()


# -- gather and scatter ----------------------------------------------------------------------------
def _positive(index: torch.Tensor, size: int | torch.Tensor) -> torch.Tensor:
    return torch.where(index < 0, index + size, index)


@op
def Gather(node, x, index):
    axis = axis_of(node.attr("axis", 0), x.dim() if not isinstance(x, np.ndarray) else x.ndim)
    if isinstance(x, np.ndarray):
        return np.take(x, index.cpu().numpy(), axis=axis)
    index = _positive(index.to(torch.int64), x.shape[axis])
    picked = x.index_select(axis, index.reshape(-1))
    return picked.reshape((*x.shape[:axis], *index.shape, *x.shape[axis + 1:]))


@op
def GatherElements(node, x, index):
    axis = axis_of(node.attr("axis", 0), x.dim())
    return torch.gather(x, axis, _positive(index.to(torch.int64), x.shape[axis]))


@op
def GatherND(node, x, index):
    b = node.attr("batch_dims", 0)
    k = index.shape[-1]
    index = _positive(index.to(torch.int64),
                      torch.tensor(x.shape[b:b + k], device=x.device))
    batch = math.prod(x.shape[:b])
    xb = x.reshape(batch, *x.shape[b:])
    ib = index.reshape(batch, *index.shape[b:])
    rows = torch.arange(batch, device=x.device).reshape(batch, *[1] * (ib.dim() - 2))
    picked = xb[(rows.expand(ib.shape[:-1]), *ib.unbind(-1))]
    return picked.reshape((*index.shape[:-1], *x.shape[b + k:]))


_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


@op(names=("ScatterElements", "Scatter"))  # Scatter (opset 9-10): ScatterElements, no reduction
def ScatterElements(node, x, index, updates):
    axis = axis_of(node.attr("axis", 0), x.dim())
    index = _positive(index.to(torch.int64), x.shape[axis])
    reduction = node.attr("reduction", "none")
    if reduction == "none":
        return x.scatter(axis, index, updates)
    return x.scatter_reduce(axis, index, updates, _REDUCE[reduction], include_self=True)


@op
def ScatterND(node, x, index, updates):
    k = index.shape[-1]
    index = _positive(index.to(torch.int64), torch.tensor(x.shape[:k], device=x.device))
    strides = torch.tensor([math.prod(x.shape[i + 1:k]) for i in range(k)], device=x.device)
    flat = (index * strides).sum(-1).reshape(-1)
    rest = math.prod(x.shape[k:])
    table = x.reshape(-1, rest)
    rows = updates.reshape(-1, rest)
    reduction = node.attr("reduction", "none")
    where = flat.unsqueeze(1).expand(-1, rest)
    if reduction == "none":
        out = table.scatter(0, where, rows)
    else:
        out = table.scatter_reduce(0, where, rows, _REDUCE[reduction], include_self=True)
    return out.reshape(x.shape)


# -- other index-driven ops ------------------------------------------------------------------------
@op
def OneHot(node, indices, depth, values):
    depth = int(depth.reshape(-1)[0].item())
    rank = indices.dim() + 1
    axis = axis_of(node.attr("axis", -1), rank)
    index = indices.to(torch.int64)
    index = torch.where(index < 0, index + depth, index).unsqueeze(axis)
    shape = [1] * rank
    shape[axis] = depth
    hot = index == torch.arange(depth, device=indices.device).reshape(shape)
    return torch.where(hot, values[1], values[0])


@op
def NonZero(node, x):
    return torch.nonzero(x if x.dim() else x.reshape(1)).T.contiguous() if x.dim() else \
        torch.zeros((0, int(bool(x.item()))), dtype=torch.int64, device=x.device)


@op
def Trilu(node, x, k=None):
    k = 0 if k is None else int(k.item())
    return torch.triu(x, k) if node.attr("upper", 1) else torch.tril(x, k)


@op
def Compress(node, x, condition):
    axis = node.attr("axis")
    if axis is None:
        x, axis = x.reshape(-1), 0
    picks = torch.nonzero(condition.reshape(-1)).reshape(-1)
    return x.index_select(axis_of(axis, x.dim()), picks)


@op
def ReverseSequence(node, x, lengths):
    batch_axis, time_axis = node.attr("batch_axis", 1), node.attr("time_axis", 0)
    y = x.clone()
    for b, n in enumerate(lengths.tolist()):
        row = x.select(batch_axis, b)
        t = time_axis if time_axis < batch_axis else time_axis - 1
        reversed_part = row.narrow(t, 0, n).flip(t)
        y.select(batch_axis, b).narrow(t, 0, n).copy_(reversed_part)
    return y


@op
def Unique(node, x):
    array = dtypes.to_numpy(x.float() if x.dtype == torch.bfloat16 else x)
    out = [torch.from_numpy(np.ascontiguousarray(v)).to(x.device)
           for v in host_ops.unique(array, node.attr("axis"), node.attr("sorted", 1))]
    out[0] = out[0].to(x.dtype)
    return tuple(out)


@op
def TensorScatter(node, cache, update, write_indices=None):
    axis = axis_of(node.attr("axis", -2), cache.dim())
    size, length = cache.shape[axis], update.shape[axis]
    starts = ints(write_indices) if write_indices is not None else [0] * cache.shape[0]
    out = cache.clone()
    steps = torch.arange(length, device=cache.device)
    for b, start in enumerate(starts):
        where = start + steps
        if node.attr("mode", "linear") == "circular":
            where = where % size
        out[b] = out[b].index_copy(axis - 1, where, update[b])
    return out
