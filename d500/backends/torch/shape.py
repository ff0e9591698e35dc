"""Shape and layout torch ops: constants, Shape/Size, reshapes, concatenation, slicing, padding,
depth/space moves."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from d500.backends import shapes
from d500.backends.graph import registry
from d500.backends.torch import dtypes
from d500.backends.torch.table import axis_of, constant, device_of, ints

OPS, op = registry()


# -- constants and identities ------------------------------------------------------------------
@op
def Constant(node):
    cached = node.attrs.get("_cached")
    if cached is not None:
        return cached
    for key, kind in (("value_float", np.float32), ("value_floats", np.float32),
                      ("value_int", np.int64), ("value_ints", np.int64)):
        if key in node.attrs:
            value = constant(node, np.asarray(node.attrs[key], dtype=kind))
            break
    else:
        if "value" in node.attrs:
            value = constant(node, node.attrs["value"])
        elif "value_string" in node.attrs or "value_strings" in node.attrs:
            value = np.asarray(node.attrs.get("value_string", node.attrs.get("value_strings")),
                               dtype=object)
        else:
            raise node.unsupported("only dense tensor and scalar constants")
    node.attrs["_cached"] = value
    return value


@op
def Identity(node, x):
    return x


@op
def Shape(node, x):
    shape = list(x.shape)
    start, end = node.attr("start", 0), node.attr("end")
    return torch.tensor(shape[start:end], dtype=torch.int64, device=device_of(node))


@op
def Size(node, x):
    return torch.tensor(math.prod(x.shape), dtype=torch.int64, device=device_of(node))


@op
def ConstantOfShape(node, shape):
    value = node.attr("value")
    if value is None:
        value = np.zeros(1, dtype=np.float32)
    fill = constant(node, value.reshape(-1))
    return fill.reshape(()).expand(ints(shape)).clone()


@op
def Range(node, start, limit, delta):
    count = max(math.ceil((limit.item() - start.item()) / delta.item()), 0)
    steps = torch.arange(count, device=start.device, dtype=delta.dtype)
    return (start + steps * delta).to(start.dtype)


@op
def EyeLike(node, x):
    k = node.attr("k", 0)
    dtype = node.attr("dtype")
    target = dtypes.storage(dtype) if dtype is not None else x.dtype
    rows = torch.arange(x.shape[0], device=x.device).unsqueeze(1)
    cols = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
    return (cols - rows == k).to(target)


# -- reshaping ------------------------------------------------------------------------------------
@op
def Reshape(node, x, shape=None):
    target = ints(shape) if shape is not None else list(node.attr("shape"))
    if not node.attr("allowzero", 0):
        target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
    return x.reshape(target)


@op
def Flatten(node, x):
    axis = axis_of(node.attr("axis", 1), x.dim())
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


@op
def Transpose(node, x):
    perm = node.attr("perm")
    return x.permute(perm) if perm is not None else x.permute(*reversed(range(x.dim())))


def _axes(node, axes):
    return list(node.attr("axes")) if node.opset < 13 and node.attr("axes") is not None \
        else ints(axes)


@op
def Squeeze(node, x, axes=None):
    axes = _axes(node, axes)
    if axes is None:
        return x.squeeze()
    return x.squeeze(tuple(axis_of(a, x.dim()) for a in axes)) if axes else x


@op
def Unsqueeze(node, x, axes=None):
    axes = _axes(node, axes)
    rank = x.dim() + len(axes)
    for a in sorted(axis_of(a, rank) for a in axes):
        x = x.unsqueeze(a)
    return x


@op
def Expand(node, x, shape):
    return x.expand(torch.broadcast_shapes(tuple(x.shape), tuple(ints(shape))))


@op
def Tile(node, x, repeats):
    return x.repeat(ints(repeats))


@op
def Concat(node, *xs):
    if isinstance(xs[0], np.ndarray):
        return np.concatenate(xs, axis=node.attr("axis"))
    return torch.cat(xs, node.attr("axis"))


@op
def Split(node, x, split=None):
    axis = axis_of(node.attr("axis", 0), x.dim())
    return tuple(torch.split(x, shapes.split_sizes(node, x.shape[axis], ints(split)), axis))


@op
def Slice(node, x, starts=None, ends=None, axes=None, steps=None):
    if node.opset >= 10:
        starts, ends, axes, steps = ints(starts), ints(ends), ints(axes), ints(steps)
    index: list = [slice(None)] * x.dim()
    flips = []
    for axis, first, stop, step in shapes.slices(node, x.shape, starts, ends, axes, steps):
        if step > 0:
            index[axis] = slice(first, stop, step)
        else:
            picks = torch.arange(first, stop, step, device=x.device)
            flips.append((axis, picks))
    y = x[tuple(index)]
    for axis, picks in flips:
        y = y.index_select(axis, picks)
    return y


# -- padding ---------------------------------------------------------------------------------------
def _pad_index(size: int, before: int, after: int, mode: str, device) -> torch.Tensor:
    i = torch.arange(-before, size + after, device=device)
    if mode == "edge":
        return i.clamp(0, size - 1)
    if mode == "wrap":
        return i.remainder(size)
    period = 2 * (size - 1) if size > 1 else 1  # reflect
    i = i.remainder(period)
    return torch.where(i >= size, period - i, i)


@op
def Pad(node, x, pads=None, value=None, axes=None):
    if node.opset < 11:
        pads, mode, fill = list(node.attr("pads")), node.attr("mode", "constant"), node.attr(
            "value", 0.0)
    else:
        pads, mode = ints(pads), node.attr("mode", "constant")
        fill = 0 if value is None or value.numel() == 0 else value.item()
    widths = shapes.pad_widths(pads, ints(axes), x.dim())
    if mode == "constant":
        return F.pad(x, [p for b, e in reversed(widths) for p in (b, e)], value=fill)
    for axis, (b, e) in enumerate(widths):
        if b or e:
            x = x.index_select(axis, _pad_index(x.shape[axis], b, e, mode, x.device))
    return x


# -- depth and space ---------------------------------------------------------------------------
@op
def DepthToSpace(node, x):
    blocks, perm, out = shapes.depth_to_space(node, x.shape)
    return x.reshape(blocks).permute(perm).reshape(out)


@op
def SpaceToDepth(node, x):
    blocks, perm, out = shapes.space_to_depth(node, x.shape)
    return x.reshape(blocks).permute(perm).reshape(out)
