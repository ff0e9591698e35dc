"""Convolution torch ops (Conv, ConvTranspose) and the window geometry they share with
pooling."""

from __future__ import annotations

import math

import torch.nn.functional as F

from d500.backends.graph import registry

OPS, op = registry()


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def window_geometry(node, x, kernel: list[int]
                    ) -> tuple[list[int], list[int], list[int], list[int]]:
    """(strides, dilations, pads_begin, pads_end) of a conv/pool node for input `x`."""
    n = len(kernel)
    strides = node.attr("strides") or [1] * n
    dilations = node.attr("dilations") or [1] * n
    auto_pad = node.attr("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for size, k, s, d in zip(x.shape[2:], kernel, strides, dilations):
            total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small = total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else total - small)
            end.append(total - begin[-1])
        return strides, dilations, begin, end
    if auto_pad == "VALID":
        return strides, dilations, [0] * n, [0] * n
    pads = node.attr("pads") or [0] * (2 * n)
    return strides, dilations, list(pads[:n]), list(pads[n:])


def pad_spatial(x, begin, end, value=0.0):
    """x padded by `begin` and `end` on its spatial axes (negative pads crop), with `value`."""
    pads = []
    for b, e in zip(reversed(begin), reversed(end)):
        pads += [b, e]
    return F.pad(x, pads, value=value) if any(pads) else x


@op
def Conv(node, x, w, b=None):
    kernel = list(w.shape[2:])
    strides, dilations, begin, end = window_geometry(node, x, kernel)
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
    strides = node.attr("strides") or [1] * n
    dilations = node.attr("dilations") or [1] * n
    out_pad = node.attr("output_padding") or [0] * n
    group = node.attr("group", 1)
    auto_pad = node.attr("auto_pad", "NOTSET")
    output_shape = node.attr("output_shape")
    full = [s * (i - 1) + (k - 1) * d + 1 + p
            for i, k, s, d, p in zip(x.shape[2:], kernel, strides, dilations, out_pad)]
    if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = (list(output_shape)[-n:] if output_shape is not None
                  else [i * s for i, s in zip(x.shape[2:], strides)])
        totals = [f - t for f, t in zip(full, target)]
        if auto_pad == "SAME_UPPER":
            begin = [t // 2 for t in totals]
        elif auto_pad == "SAME_LOWER":
            begin = [t - t // 2 for t in totals]
        else:  # explicit output_shape: the output starts at the first full position
            begin = [0] * n
        end = [t - bg for t, bg in zip(totals, begin)]
    else:
        pads = node.attr("pads") or [0] * (2 * n)
        begin, end = list(pads[:n]), list(pads[n:])
    conv = _CONV_T.get(n)
    if conv is None:
        raise node.unsupported(f"{n}-D transposed convolution")
    if begin == end and all(p < s or p < d for p, s, d in zip(out_pad, strides, dilations)) \
            and min(begin) >= 0:
        return conv(x, w, b, strides, begin, out_pad, group, dilations)
    y = conv(x, w, None, strides, 0, 0, group, dilations)
    y = pad_spatial(y, [-p for p in begin], [p - e for p, e in zip(out_pad, end)])
    return y if b is None else y + b.reshape(-1, *[1] * n)
