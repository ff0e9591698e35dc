"""Detection JAX ops: RoiAlign (on regions known while tracing: they decide the sampling grids),
DeformConv (traced, through grid sampling); NonMaxSuppression is a shared host op."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from d500.backends import host_ops
from d500.backends.graph import registry
from d500.backends.jax.core import NotStatic, static
from d500.backends.jax.image import grid_sample

OPS, op = registry()


def _host(x, what: str) -> np.ndarray:
    value = static(x)
    if value is None:
        raise NotStatic(what, x)
    return value


@op
def RoiAlign(node, x, rois, batch_indices):
    """Average or max of bilinear samples per bin, at the shared sampling grid of each region."""
    pooled = (node.attr("output_height", 1), node.attr("output_width", 1))
    scale, ratio = node.attr("spatial_scale", 1.0), node.attr("sampling_ratio", 0)
    half = node.attr("coordinate_transformation_mode", "half_pixel") == "half_pixel"
    n, c, h, w = x.shape
    data = x.reshape(n, c, h * w)
    outs = []
    for roi, b in zip(_host(rois, "rois").tolist(),
                      _host(batch_indices, "batch indices").reshape(-1).tolist()):
        pos, weights, count = host_ops.roi_samples(roi, scale, pooled, (h, w), ratio, half)
        if count == 0:
            outs.append(jnp.zeros((c, *pooled), x.dtype))
            continue
        vals = data[int(b)][:, pos.reshape(-1)].reshape(c, *pos.shape)
        vals = vals * jnp.asarray(weights, x.dtype)
        if node.attr("mode", "avg") == "avg":
            outs.append(vals.sum(axis=(3, 4, 5)) / count)
        else:
            outs.append(vals.max(axis=-1).max(axis=(3, 4)))
    return jnp.stack(outs) if outs else jnp.zeros((0, c, *pooled), x.dtype)


@op
def DeformConv(node, x, w, offset, b=None, mask=None):
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
    ki = np.repeat(np.arange(kh), kw) * dh
    kj = np.tile(np.arange(kw), kh) * dw
    base_y = (np.arange(oh) * sh - pt).reshape(1, 1, 1, oh, 1)
    base_x = (np.arange(ow) * sw - pl).reshape(1, 1, 1, 1, ow)
    y = base_y + ki.reshape(1, 1, k, 1, 1) + off[:, :, :, 0]  # n, groups, k, oh, ow
    xs = base_x + kj.reshape(1, 1, k, 1, 1) + off[:, :, :, 1]
    gy = 2 * y / max(height - 1, 1) - 1
    gx = 2 * xs / max(width - 1, 1) - 1
    grid = jnp.stack([gx, gy], -1).reshape(n * off_groups, k * oh, ow, 2)
    feature = x.reshape(n * off_groups, c // off_groups, height, width)
    sampled = grid_sample(feature, grid, "linear", "zeros", 1)
    sampled = sampled.reshape(n, off_groups, c // off_groups, k, oh, ow)
    if mask is not None:
        sampled = sampled * mask.reshape(n, off_groups, 1, k, oh, ow)
    cols = sampled.reshape(n, group, group_c * k, oh * ow)
    out = jnp.matmul(w.reshape(group, out_c // group, group_c * k), cols, precision="highest")
    out = out.reshape(n, out_c, oh, ow)
    return out if b is None else out + b.reshape(1, -1, 1, 1)
