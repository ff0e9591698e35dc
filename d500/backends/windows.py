"""The window geometry of convolution and pooling nodes in Python ints, shared by the backends:
strides, dilations and the pads ONNX's `pads`/`auto_pad`/`ceil_mode`/`output_shape` ask for,
from a node's attributes and its input's spatial shape."""

from __future__ import annotations

import math


def window_geometry(node, spatial, kernel: list[int]
                    ) -> tuple[list[int], list[int], list[int], list[int]]:
    """(strides, dilations, pads_begin, pads_end) of a conv/pool node over `spatial`."""
    n = len(kernel)
    strides = list(node.attr("strides") or [1] * n)
    dilations = list(node.attr("dilations") or [1] * n)
    auto_pad = node.attr("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for size, k, s, d in zip(spatial, kernel, strides, dilations):
            total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small = total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else total - small)
            end.append(total - begin[-1])
        return strides, dilations, begin, end
    if auto_pad == "VALID":
        return strides, dilations, [0] * n, [0] * n
    pads = node.attr("pads") or [0] * (2 * n)
    return strides, dilations, list(pads[:n]), list(pads[n:])


def pool_geometry(node, spatial) -> tuple[list[int], list[int], list[int], list[int],
                                          list[int], bool, list[int]]:
    """(kernel, strides, dilations, begin, end, ceil_mode, extra) of a pooling node: `extra`
    per axis is how much more (or, negative, less) than `end` its last window reaches."""
    kernel = list(node.attr("kernel_shape"))
    strides, dilations, begin, end = window_geometry(node, spatial, kernel)
    ceil = bool(node.attr("ceil_mode", 0))
    extra = []
    for size, k, s, d, b, e in zip(spatial, kernel, strides, dilations, begin, end):
        span = (k - 1) * d + 1
        out = (size + b + e - span) / s
        out = (math.ceil(out) if ceil else math.floor(out)) + 1
        if ceil and (out - 1) * s >= size + b:
            out -= 1
        extra.append((out - 1) * s + span - (size + b + e))
    return kernel, strides, dilations, begin, end, ceil, extra


def transpose_geometry(node, spatial, kernel: list[int]
                       ) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """(strides, dilations, output_padding, begin, end) of a ConvTranspose node: `begin` and
    `end` are cropped from its full output."""
    n = len(spatial)
    strides = list(node.attr("strides") or [1] * n)
    dilations = list(node.attr("dilations") or [1] * n)
    out_pad = list(node.attr("output_padding") or [0] * n)
    auto_pad = node.attr("auto_pad", "NOTSET")
    output_shape = node.attr("output_shape")
    full = [s * (i - 1) + (k - 1) * d + 1 + p
            for i, k, s, d, p in zip(spatial, kernel, strides, dilations, out_pad)]
    if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = (list(output_shape)[-n:] if output_shape is not None
                  else [i * s for i, s in zip(spatial, strides)])
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
    return strides, dilations, out_pad, begin, end


def unpool_shape(node, shape) -> list[int]:
    """The output shape of a MaxUnpool node over an input of `shape` (output_shape aside)."""
    n = len(shape) - 2
    kernel = list(node.attr("kernel_shape"))
    strides = node.attr("strides") or [1] * n
    pads = node.attr("pads") or [0] * (2 * n)
    return list(shape[:2]) + [
        (i - 1) * s + k - pads[d] - pads[d + n]
        for d, (i, k, s) in enumerate(zip(shape[2:], kernel, strides))]
