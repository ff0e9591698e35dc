"""Pooling torch ops: max, average and Lp pooling (windowed and global), MaxUnpool."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from d500.backends.graph import registry
from d500.backends.torch.conv import pad_spatial
from d500.backends.torch.table import ints
from d500.backends.windows import pool_geometry, unpool_shape

OPS, op = registry()


_MAXPOOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVGPOOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _windows(x, kernel, strides, dilations):
    """Sliding windows of a padded N,C,*spatial tensor: N,C,*out,*kernel."""
    for i, (k, s, d) in enumerate(zip(kernel, strides, dilations)):
        x = x.unfold(2 + i, (k - 1) * d + 1, s)
        if d > 1:
            x = x[..., ::d]
    return x


def _native_pool_ok(kernel, begin, end, ceil, extra) -> bool:
    return (begin == end and all(2 * p <= k for p, k in zip(begin, kernel))
            and len(kernel) in (1, 2, 3) and (ceil or all(e <= 0 for e in extra)))


@op
def MaxPool(node, x):
    kernel, strides, dilations, begin, end, ceil, extra = pool_geometry(node, x.shape[2:])
    want_indices = len(node.outputs) > 1 and node.outputs[1]
    if _native_pool_ok(kernel, begin, end, ceil, extra) and not (
            x.dtype in (torch.int8, torch.uint8) and ceil):
        pool = _MAXPOOL[len(kernel)]
        # CUDA has no 8-bit max pooling; float32 holds every 8-bit value exactly.
        work = x.float() if x.dtype in (torch.int8, torch.uint8) and x.is_cuda else x
        if not want_indices:
            return pool(work, kernel, strides, begin, dilations, ceil).to(x.dtype)
        y, idx = pool(work, kernel, strides, begin, dilations, ceil, True)
        y = y.to(x.dtype)
        spatial = x.shape[2:]
        plane = math.prod(spatial)
        if node.attr("storage_order", 0) == 1:
            coords, rest = [], idx
            for size in reversed(spatial):
                coords.append(rest % size)
                rest = rest // size
            coords.reverse()
            idx, stride = torch.zeros_like(idx), 1
            for c, size in zip(coords, spatial):
                idx, stride = idx + c * stride, stride * size
        offset = torch.arange(x.shape[0] * x.shape[1], device=x.device) * plane
        idx = idx + offset.reshape(x.shape[0], x.shape[1], *[1] * len(spatial))
        return y, idx
    if want_indices:
        raise node.unsupported("indices output with asymmetric or large padding")
    low = -math.inf if x.is_floating_point() else torch.iinfo(x.dtype).min
    padded = pad_spatial(x, begin, [e + max(x_, 0) for e, x_ in zip(end, extra)], low)
    win = _windows(padded, kernel, strides, dilations)
    return win.amax(dim=tuple(range(-len(kernel), 0)))


@op
def AveragePool(node, x):
    kernel, strides, dilations, begin, end, ceil, extra = pool_geometry(node, x.shape[2:])
    include_pad = bool(node.attr("count_include_pad", 0))
    if _native_pool_ok(kernel, begin, end, ceil, extra) and all(d == 1 for d in dilations):
        return _AVGPOOL[len(kernel)](x, kernel, strides, begin, ceil, include_pad)
    more = [max(e, 0) for e in extra]
    padded = pad_spatial(x, begin, [e + m for e, m in zip(end, more)])
    dims = tuple(range(-len(kernel), 0))
    total = _windows(padded, kernel, strides, dilations).sum(dim=dims)
    ones = torch.ones((1, 1, *x.shape[2:]), dtype=x.dtype, device=x.device)
    if include_pad:
        ones = pad_spatial(ones, begin, end, 1.0)
        count = pad_spatial(ones, [0] * len(kernel), more)
    else:
        count = pad_spatial(ones, begin, [e + m for e, m in zip(end, more)])
    count = _windows(count, kernel, strides, dilations).sum(dim=dims)
    return total / count


@op
def LpPool(node, x):
    kernel, strides, dilations, begin, end, _, extra = pool_geometry(node, x.shape[2:])
    p = node.attr("p", 2)
    padded = pad_spatial(x, begin, [e + max(m, 0) for e, m in zip(end, extra)])
    win = _windows(padded, kernel, strides, dilations)
    dims = tuple(range(-len(kernel), 0))
    return win.abs().pow(p).sum(dim=dims).pow(1.0 / p)


@op
def GlobalAveragePool(node, x):
    return x.mean(dim=tuple(range(2, x.dim())), keepdim=True)


@op
def GlobalMaxPool(node, x):
    return x.amax(dim=tuple(range(2, x.dim())), keepdim=True)


@op
def GlobalLpPool(node, x):
    p = node.attr("p", 2)
    return x.abs().pow(p).sum(dim=tuple(range(2, x.dim())), keepdim=True).pow(1.0 / p)


@op
def MaxUnpool(node, x, indices, output_shape=None):
    shape = unpool_shape(node, x.shape)
    y = torch.zeros(math.prod(shape), dtype=x.dtype, device=x.device)
    y = y.index_put((indices.reshape(-1),), x.reshape(-1)).reshape(shape)
    if output_shape is not None:  # a larger output keeps the indices' coordinates
        target = ints(output_shape)
        y = F.pad(y, [p for t, s in zip(reversed(target), reversed(shape)) for p in (0, t - s)])
    return y
