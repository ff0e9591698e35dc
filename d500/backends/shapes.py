"""The index arithmetic of the shape ops in Python ints, shared by the backends: Split's sizes,
Slice's bounds, Pad's widths, DepthToSpace's and SpaceToDepth's block moves."""

from __future__ import annotations

import math


def split_sizes(node, length: int, sizes: list[int] | None) -> list[int]:
    """A Split node's part sizes along an axis of `length`: `sizes` (its input), else its
    attribute, else num_outputs parts of equal size, the last smaller."""
    sizes = sizes if sizes is not None else node.attr("split")
    if sizes is None:
        parts = node.attr("num_outputs") or len(node.outputs)
        chunk = math.ceil(length / parts)
        sizes = [min(chunk, length - i * chunk) for i in range(parts)]
    return list(sizes)


def slices(node, shape, starts, ends, axes, steps) -> list[tuple[int, int, int, int]]:
    """(axis, first, stop, step) per sliced axis of a Slice node over `shape`, as Python's
    slice.indices gives them, from its inputs as ints (its attributes before opset 10)."""
    if node.opset < 10:
        starts, ends, axes = node.attr("starts"), node.attr("ends"), node.attr("axes")
    axes = axes or list(range(len(starts)))
    steps = steps or [1] * len(starts)
    out = []
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis = axis + len(shape) if axis < 0 else axis
        out.append((axis, *slice(start, end, step).indices(shape[axis])))
    return out


def pad_widths(pads: list[int], axes: list[int] | None, rank: int) -> list[tuple[int, int]]:
    """(before, after) per axis of a Pad node's `pads` over `axes` (all when None); negative
    widths crop."""
    axes = [a + rank if a < 0 else a for a in axes] if axes is not None else list(range(rank))
    n = len(axes)
    begin, end = dict(zip(axes, pads[:n])), dict(zip(axes, pads[n:]))
    return [(begin.get(a, 0), end.get(a, 0)) for a in range(rank)]


def depth_to_space(node, shape) -> tuple[list, tuple[int, ...], list]:
    """(the blocks' shape, their permutation, the output shape) of a DepthToSpace node."""
    bs = node.attr("blocksize")
    n, c, h, w = shape
    out = [n, c // bs**2, h * bs, w * bs]
    if node.attr("mode", "DCR") == "DCR":
        return [n, bs, bs, c // bs**2, h, w], (0, 3, 4, 1, 5, 2), out
    return [n, c // bs**2, bs, bs, h, w], (0, 1, 4, 2, 5, 3), out


def space_to_depth(node, shape) -> tuple[list, tuple[int, ...], list]:
    """(the blocks' shape, their permutation, the output shape) of a SpaceToDepth node."""
    bs = node.attr("blocksize")
    n, c, h, w = shape
    perm = (0, 3, 5, 1, 2, 4) if node.attr("mode", "DCR") == "DCR" else (0, 1, 3, 5, 2, 4)
    return [n, c, h // bs, bs, w // bs, bs], perm, [n, c * bs * bs, h // bs, w // bs]
