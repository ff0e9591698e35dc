"""Detection torch ops: NonMaxSuppression, RoiAlign, DeformConv."""

from __future__ import annotations

import math

import torch

from d500.backends.graph import registry

OPS, op = registry()


def _corners(boxes: torch.Tensor, center: bool) -> torch.Tensor:
    """Boxes as (y_min, x_min, y_max, x_max), whatever corner order or format they come in."""
    if center:
        x, y, w, h = boxes.unbind(-1)
        return torch.stack([y - h / 2, x - w / 2, y + h / 2, x + w / 2], -1)
    y1, x1, y2, x2 = boxes.unbind(-1)
    return torch.stack([torch.minimum(y1, y2), torch.minimum(x1, x2),
                        torch.maximum(y1, y2), torch.maximum(x1, x2)], -1)


def _iou(box: torch.Tensor, others: torch.Tensor) -> torch.Tensor:
    top = torch.maximum(box[0], others[:, 0])
    left = torch.maximum(box[1], others[:, 1])
    bottom = torch.minimum(box[2], others[:, 2])
    right = torch.minimum(box[3], others[:, 3])
    inter = (bottom - top).clamp(min=0) * (right - left).clamp(min=0)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1])
    union = area + areas - inter
    return torch.where((inter > 0) & (union > 0), inter / union, torch.zeros_like(inter))


@op
def NonMaxSuppression(node, boxes, scores, max_out=None, iou_threshold=None,
                      score_threshold=None):
    limit = int(max_out.reshape(-1)[0]) if max_out is not None and max_out.numel() else 0
    iou_limit = float(iou_threshold.reshape(-1)[0]) if iou_threshold is not None and \
        iou_threshold.numel() else 0.0
    floor = float(score_threshold.reshape(-1)[0]) if score_threshold is not None and \
        score_threshold.numel() else None
    corners = _corners(boxes.to(torch.float64), bool(node.attr("center_point_box", 0)))
    selected = []
    for b in range(scores.shape[0]):
        for c in range(scores.shape[1]):
            s = scores[b, c]
            order = torch.sort(s, descending=True, stable=True).indices.tolist()
            kept: list[int] = []
            for i in order:
                if len(kept) >= limit:
                    break
                if floor is not None and not float(s[i]) > floor:
                    break
                if kept and bool((_iou(corners[b, i], corners[b, kept]) > iou_limit).any()):
                    continue
                kept.append(i)
            selected += [[b, c, i] for i in kept]
    return torch.tensor(selected, dtype=torch.int64, device=boxes.device).reshape(-1, 3)


def _bilinear_terms(feature: torch.Tensor, y: torch.Tensor, x: torch.Tensor):
    """The four weighted corner values of bilinear samples at (y, x), as RoiAlign defines them."""
    height, width = feature.shape[-2:]
    outside = (y < -1.0) | (y > height) | (x < -1.0) | (x > width)
    y, x = y.clamp(min=0), x.clamp(min=0)
    y_low, x_low = y.floor().long(), x.floor().long()
    y_edge, x_edge = y_low >= height - 1, x_low >= width - 1
    y_low = torch.where(y_edge, height - 1, y_low)
    x_low = torch.where(x_edge, width - 1, x_low)
    y = torch.where(y_edge, y_low.to(y.dtype), y)
    x = torch.where(x_edge, x_low.to(x.dtype), x)
    y_high = torch.where(y_edge, y_low, y_low + 1)
    x_high = torch.where(x_edge, x_low, x_low + 1)
    ly, lx = y - y_low, x - x_low
    hy, hx = 1 - ly, 1 - lx
    keep = (~outside).to(feature.dtype)
    corners = [(y_low, x_low, hy * hx), (y_low, x_high, hy * lx), (y_high, x_low, ly * hx),
               (y_high, x_high, ly * lx)]
    return [feature[:, yy, xx] * (w * keep) for yy, xx, w in corners]


@op
def RoiAlign(node, x, rois, batch_indices):
    out_h, out_w = node.attr("output_height", 1), node.attr("output_width", 1)
    ratio = node.attr("sampling_ratio", 0)
    scale = node.attr("spatial_scale", 1.0)
    half_pixel = node.attr("coordinate_transformation_mode", "half_pixel") == "half_pixel"
    mode = node.attr("mode", "avg")
    offset = 0.5 if half_pixel else 0.0
    outputs = []
    for roi, b in zip(rois.tolist(), batch_indices.tolist()):
        x0, y0, x1, y1 = (v * scale - offset for v in roi)
        roi_w, roi_h = x1 - x0, y1 - y0
        if not half_pixel:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        bin_h, bin_w = roi_h / out_h, roi_w / out_w
        grid_h = ratio if ratio > 0 else math.ceil(roi_h / out_h)
        grid_w = ratio if ratio > 0 else math.ceil(roi_w / out_w)
        iy = torch.arange(out_h * grid_h, dtype=x.dtype, device=x.device)
        ix = torch.arange(out_w * grid_w, dtype=x.dtype, device=x.device)
        ys = y0 + (iy // grid_h) * bin_h + (iy % grid_h + 0.5) * bin_h / grid_h
        xs = x0 + (ix // grid_w) * bin_w + (ix % grid_w + 0.5) * bin_w / grid_w
        yy, xx = torch.meshgrid(ys, xs, indexing="ij")
        terms = _bilinear_terms(x[int(b)], yy, xx)  # each C, out_h*grid_h, out_w*grid_w
        channels = x.shape[1]
        if mode == "max":
            value = torch.stack(terms).amax(0)
            pooled = value.reshape(channels, out_h, grid_h, out_w, grid_w).amax((2, 4))
        else:
            value = sum(terms)
            pooled = value.reshape(channels, out_h, grid_h, out_w, grid_w).sum((2, 4)) / max(
                grid_h * grid_w, 1)
        outputs.append(pooled)
    if not outputs:
        return x.new_zeros(0, x.shape[1], out_h, out_w)
    return torch.stack(outputs)


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
