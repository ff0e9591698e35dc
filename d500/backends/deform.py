"""DeformConv written once over a framework's primitives (its `Kit`): the kernel taps moved by
the offsets, sampled bilinearly (zero padding, corners aligned), masked, and contracted with
the weights group by group."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


@dataclass(frozen=True)
class Kit:
    """The primitives DeformConv uses, as one framework provides them."""

    asarray: Callable[[np.ndarray, Any], Any]  # (NumPy integers, like): where `like` lives
    stack: Callable[[list, int], Any]
    sample: Callable[[Any, Any], Any]  # (N,C,H,W features, N,h,w,2 grid in [-1, 1]): N,C,h,w
    matmul: Callable[[Any, Any], Any]


def deform_conv(kit: Kit, node, x, w, offset, b=None, mask=None):
    """A DeformConv node on 2-D inputs."""
    n, c, height, width = x.shape
    out_c, group_c, kh, kw = w.shape
    group = node.attr("group", 1)
    off_groups = node.attr("offset_group", 1)
    sh, sw = node.attr("strides") or [1, 1]
    dh, dw = node.attr("dilations") or [1, 1]
    pt, pl, _, _ = node.attr("pads") or [0, 0, 0, 0]
    oh, ow = offset.shape[2:]
    k = kh * kw
    off = offset.reshape(n, off_groups, k, 2, oh, ow)
    ki = kit.asarray(np.repeat(np.arange(kh), kw) * dh, x)
    kj = kit.asarray(np.tile(np.arange(kw), kh) * dw, x)
    base_y = kit.asarray((np.arange(oh) * sh - pt).reshape(1, 1, 1, oh, 1), x)
    base_x = kit.asarray((np.arange(ow) * sw - pl).reshape(1, 1, 1, 1, ow), x)
    y = base_y + ki.reshape(1, 1, k, 1, 1) + off[:, :, :, 0]  # n, groups, k, oh, ow
    xs = base_x + kj.reshape(1, 1, k, 1, 1) + off[:, :, :, 1]
    gy = 2 * y / max(height - 1, 1) - 1
    gx = 2 * xs / max(width - 1, 1) - 1
    grid = kit.stack([gx, gy], -1).reshape(n * off_groups, k * oh, ow, 2)
    feature = x.reshape(n * off_groups, c // off_groups, height, width)
    sampled = kit.sample(feature, grid)
    sampled = sampled.reshape(n, off_groups, c // off_groups, k, oh, ow)
    if mask is not None:
        sampled = sampled * mask.reshape(n, off_groups, 1, k, oh, ow)
    cols = sampled.reshape(n, group, group_c * k, oh * ow)
    out = kit.matmul(w.reshape(group, out_c // group, group_c * k), cols)
    out = out.reshape(n, out_c, oh, ow)
    return out if b is None else out + b.reshape(1, -1, 1, 1)
