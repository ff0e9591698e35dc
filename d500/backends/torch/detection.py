"""Detection torch ops: RoiAlign, DeformConv (NonMaxSuppression is a shared host op)."""

from __future__ import annotations

import torch

from d500.backends import host_ops
from d500.backends.graph import registry

OPS, op = registry()


@op
def RoiAlign(node, x, rois, batch_indices):
    """Average or max of bilinear samples per bin, at the shared sampling grid of each region."""
    pooled = (node.attr("output_height", 1), node.attr("output_width", 1))
    scale, ratio = node.attr("spatial_scale", 1.0), node.attr("sampling_ratio", 0)
    half = node.attr("coordinate_transformation_mode", "half_pixel") == "half_pixel"
    n, c, h, w = x.shape
    data = x.reshape(n, c, h * w)
    outs = []
    for roi, b in zip(rois.tolist(), batch_indices.reshape(-1).tolist()):
        pos, weights, count = host_ops.roi_samples(roi, scale, pooled, (h, w), ratio, half)
        if count == 0:
            outs.append(x.new_zeros(c, *pooled))
            continue
        vals = data[int(b)][:, torch.as_tensor(pos.reshape(-1), device=x.device)]
        vals = vals.reshape(c, *pos.shape) * torch.as_tensor(weights, dtype=x.dtype,
                                                             device=x.device)
        if node.attr("mode", "avg") == "avg":
            outs.append(vals.sum((3, 4, 5)) / count)
        else:
            outs.append(vals.amax(-1).amax((3, 4)))
    return torch.stack(outs) if outs else x.new_zeros(0, c, *pooled)


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
    ki = torch.arange(kh, device=x.device).repeat_interleave(kw) * dh
    kj = torch.arange(kw, device=x.device).repeat(kh) * dw
    base_y = (torch.arange(oh, device=x.device) * sh - pt).reshape(1, 1, 1, oh, 1)
    base_x = (torch.arange(ow, device=x.device) * sw - pl).reshape(1, 1, 1, 1, ow)
    y = base_y + ki.reshape(1, 1, k, 1, 1) + off[:, :, :, 0]  # n, groups, k, oh, ow
    xs = base_x + kj.reshape(1, 1, k, 1, 1) + off[:, :, :, 1]
    gy = 2 * y / max(height - 1, 1) - 1
    gx = 2 * xs / max(width - 1, 1) - 1
    grid = torch.stack([gx, gy], -1).reshape(n * off_groups, k * oh, ow, 2).to(x.dtype)
    feature = x.reshape(n * off_groups, c // off_groups, height, width)
    sampled = torch.nn.functional.grid_sample(feature, grid, mode="bilinear",
                                              padding_mode="zeros", align_corners=True)
    sampled = sampled.reshape(n, off_groups, c // off_groups, k, oh, ow)
    if mask is not None:
        sampled = sampled * mask.reshape(n, off_groups, 1, k, oh, ow)
    cols = sampled.reshape(n, group, group_c * k, oh * ow)
    out = torch.matmul(w.reshape(group, out_c // group, group_c * k), cols)
    out = out.reshape(n, out_c, oh, ow)
    return out if b is None else out + b.reshape(1, -1, 1, 1)
