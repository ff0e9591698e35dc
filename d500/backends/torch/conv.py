"""Convolution torch ops: Conv, ConvTranspose (their window geometry is the shared `windows`),
and the spatial padding pooling shares."""

from __future__ import annotations

import torch.nn.functional as F

from d500.backends.graph import registry
from d500.backends.windows import transpose_geometry, window_geometry

OPS, op = registry()


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def pad_spatial(x, begin, end, value=0.0):
    """x padded by `begin` and `end` on its spatial axes (negative pads crop), with `value`."""
    pads = []
    for b, e in zip(reversed(begin), reversed(end)):
        pads += [b, e]
    return F.pad(x, pads, value=value) if any(pads) else x


@op
def Conv(node, x, w, b=None):
    kernel = list(w.shape[2:])
    strides, dilations, begin, end = window_geometry(node, x.shape[2:], kernel)
    group = node.attr("group", 1)
    if begin != end:
        x, begin = pad_spatial(x, begin, end), [0] * len(begin)
    conv = _CONV.get(len(kernel))
    if conv is None:
        raise node.unsupported(f"{len(kernel)}-D convolution")
    return conv(x, w, b, strides, begin, dilations, group)


@op
def ConvTranspose(node, x, w, b=None):
    n = x.dim() - 2
    kernel = list(w.shape[2:])
    strides, dilations, out_pad, begin, end = transpose_geometry(node, x.shape[2:], kernel)
    group = node.attr("group", 1)
    conv = _CONV_T.get(n)
    if conv is None:
        raise node.unsupported(f"{n}-D transposed convolution")
    if begin == end and all(p < s or p < d for p, s, d in zip(out_pad, strides, dilations)) \
            and min(begin) >= 0:
        return conv(x, w, b, strides, begin, out_pad, group, dilations)
    y = conv(x, w, None, strides, 0, 0, group, dilations)
    y = pad_spatial(y, [-p for p in begin], [p - e for p, e in zip(out_pad, end)])
    return y if b is None else y + b.reshape(-1, *[1] * n)
