"""Detection JAX ops: NonMaxSuppression, RoiAlign (both on values known while tracing: their
output shapes or sampling grids depend on them), DeformConv (traced, through grid sampling)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from d500.backends.graph import registry
from d500.backends.jax.core import NotStatic, static
from d500.backends.jax.image import grid_sample

OPS, op = registry()


def _host(x, what: str) -> np.ndarray:
    value = static(x)
    if value is None:
        raise NotStatic(what, x)
    return value


def _corners(boxes: np.ndarray, center: bool) -> np.ndarray:
    """Boxes as (y_min, x_min, y_max, x_max), whatever corner order or format they come in."""
    if center:
        x, y, w, h = np.moveaxis(boxes, -1, 0)
        return np.stack([y - h / 2, x - w / 2, y + h / 2, x + w / 2], -1)
    y1, x1, y2, x2 = np.moveaxis(boxes, -1, 0)
    return np.stack([np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2),
                     np.maximum(x1, x2)], -1)


def _iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    top = np.maximum(box[0], others[:, 0])
    left = np.maximum(box[1], others[:, 1])
    bottom = np.minimum(box[2], others[:, 2])
    right = np.minimum(box[3], others[:, 3])
    inter = np.clip(bottom - top, 0, None) * np.clip(right - left, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1])
    union = area + areas - inter
    return np.where((inter > 0) & (union > 0), inter / np.where(union > 0, union, 1), 0.0)


@op
def NonMaxSuppression(node, boxes, scores, max_out=None, iou_threshold=None,
                      score_threshold=None):
    boxes, scores = _host(boxes, "boxes"), _host(scores, "scores")
    limit = int(_host(max_out, "max_output_boxes_per_class").reshape(-1)[0]) if (
        max_out is not None and max_out.size) else 0
    iou_limit = float(_host(iou_threshold, "iou_threshold").reshape(-1)[0]) if (
        iou_threshold is not None and iou_threshold.size) else 0.0
    floor = float(_host(score_threshold, "score_threshold").reshape(-1)[0]) if (
        score_threshold is not None and score_threshold.size) else None
    corners = _corners(boxes.astype(np.float64), bool(node.attr("center_point_box", 0)))
    selected = []
    for b in range(scores.shape[0]):
        for c in range(scores.shape[1]):
            s = scores[b, c]
            order = np.argsort(-s.astype(np.float64), kind="stable").tolist()
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
    return jnp.asarray(np.array(selected, dtype=np.int64).reshape(-1, 3))


def _bilinear_terms(feature, y: np.ndarray, x: np.ndarray):
    """The four weighted corner values of bilinear samples at (y, x), as RoiAlign defines them."""
    height, width = feature.shape[-2:]
    outside = (y < -1.0) | (y > height) | (x < -1.0) | (x > width)
    y, x = np.clip(y, 0, None), np.clip(x, 0, None)
    y_low, x_low = np.floor(y).astype(np.int64), np.floor(x).astype(np.int64)
    y_edge, x_edge = y_low >= height - 1, x_low >= width - 1
    y_low = np.where(y_edge, height - 1, y_low)
    x_low = np.where(x_edge, width - 1, x_low)
    y = np.where(y_edge, y_low.astype(y.dtype), y)
    x = np.where(x_edge, x_low.astype(x.dtype), x)
    y_high = np.where(y_edge, y_low, y_low + 1)
    x_high = np.where(x_edge, x_low, x_low + 1)
    ly, lx = y - y_low, x - x_low
    hy, hx = 1 - ly, 1 - lx
    keep = (~outside).astype(np.float64)
    corners = [(y_low, x_low, hy * hx), (y_low, x_high, hy * lx), (y_high, x_low, ly * hx),
               (y_high, x_high, ly * lx)]
    return [feature[:, yy, xx] * jnp.asarray(w * keep, feature.dtype) for yy, xx, w in corners]


@op
def RoiAlign(node, x, rois, batch_indices):
    out_h, out_w = node.attr("output_height", 1), node.attr("output_width", 1)
    ratio = node.attr("sampling_ratio", 0)
    scale = node.attr("spatial_scale", 1.0)
    half_pixel = node.attr("coordinate_transformation_mode", "half_pixel") == "half_pixel"
    mode = node.attr("mode", "avg")
    offset = 0.5 if half_pixel else 0.0
    outputs = []
    dtype = np.dtype(x.dtype)
    for roi, b in zip(_host(rois, "rois").tolist(), _host(batch_indices, "batch indices")
                      .tolist()):
        x0, y0, x1, y1 = (v * scale - offset for v in roi)
        roi_w, roi_h = x1 - x0, y1 - y0
        if not half_pixel:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        bin_h, bin_w = roi_h / out_h, roi_w / out_w
        grid_h = ratio if ratio > 0 else math.ceil(roi_h / out_h)
        grid_w = ratio if ratio > 0 else math.ceil(roi_w / out_w)
        iy = np.arange(out_h * grid_h).astype(dtype)
        ix = np.arange(out_w * grid_w).astype(dtype)
        ys = (y0 + (iy // grid_h) * bin_h + (iy % grid_h + 0.5) * bin_h / grid_h).astype(dtype)
        xs = (x0 + (ix // grid_w) * bin_w + (ix % grid_w + 0.5) * bin_w / grid_w).astype(dtype)
        yy, xx = np.meshgrid(ys, xs, indexing="ij")
        terms = _bilinear_terms(x[int(b)], yy, xx)  # each C, out_h*grid_h, out_w*grid_w
        channels = x.shape[1]
        if mode == "max":
            value = jnp.max(jnp.stack(terms), axis=0)
            pooled = value.reshape(channels, out_h, grid_h, out_w, grid_w).max(axis=(2, 4))
        else:
            value = sum(terms)
            pooled = value.reshape(channels, out_h, grid_h, out_w, grid_w).sum(axis=(2, 4)) / max(
                grid_h * grid_w, 1)
        outputs.append(pooled)
    if not outputs:
        return jnp.zeros((0, x.shape[1], out_h, out_w), x.dtype)
    return jnp.stack(outputs)


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
