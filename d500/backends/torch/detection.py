"""Detection torch ops: RoiAlign, DeformConv (NonMaxSuppression is a shared host op)."""

from __future__ import annotations

import torch

from d500.backends import deform, host_ops
from d500.backends.graph import registry

OPS, op = registry()


@op
def RoiAlign(node, x, rois, batch_indices):
    """Average or max of bilinear samples per bin, at the shared sampling grid of each region."""
    n, c, h, w = x.shape
    pooled, samples = host_ops.roi_align(node, (h, w))
    data = x.reshape(n, c, h * w)
    outs = []
    for roi, b in zip(rois.tolist(), batch_indices.reshape(-1).tolist()):
        pos, weights, count = samples(roi)
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


_DEFORM = deform.Kit(
    asarray=lambda a, like: torch.as_tensor(a, device=like.device), stack=torch.stack,
    sample=lambda feature, grid: torch.nn.functional.grid_sample(
        feature, grid.to(feature.dtype), mode="bilinear", padding_mode="zeros",
        align_corners=True),
    matmul=torch.matmul)


@op
def DeformConv(node, x, w, offset, b=None, mask=None):
    return deform.deform_conv(_DEFORM, node, x, w, offset, b, mask)
