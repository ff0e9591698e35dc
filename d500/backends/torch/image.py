"""Image torch ops: Resize/Upsample (the shared interpolation matrices), GridSample, Col2Im, ..."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from d500.backends import host_ops, resize
from d500.backends.graph import registry
from d500.backends.torch.table import ints

OPS, op = registry()


# -- resizing: the shared per-axis matrices, applied as matrix products --------------------------
def _resize(node, x, how, scales, sizes=None, roi=None):
    compute = x.dtype if x.is_floating_point() else torch.float64
    y = x.to(compute)
    for a, w, outside in resize.plan(x.shape, how, scales, sizes, roi, node.attr("axes")):
        weights = torch.as_tensor(w, dtype=compute, device=x.device)
        y = torch.matmul(y.movedim(a, -1), weights.T).movedim(-1, a)
        if outside is not None:
            mask = torch.as_tensor(outside, device=x.device).reshape(
                [-1 if i == a else 1 for i in range(x.dim())])
            fill = torch.tensor(how["extrapolation_value"], dtype=compute, device=x.device)
            y = torch.where(mask, fill, y)
    if not x.is_floating_point():
        info = torch.iinfo(x.dtype)
        y = torch.round(y).clamp(info.min, info.max)
    return y.to(x.dtype)


def _floats(x):
    return [float(v) for v in x.reshape(-1).tolist()] if x is not None and x.numel() else None


@op
def Resize(node, x, roi=None, scales=None, sizes=None):
    if node.opset < 11:
        scales, roi = roi, None
    sizes = ints(sizes) if sizes is not None and sizes.numel() else None
    return _resize(node, x, resize.how(node), _floats(scales), sizes, _floats(roi))


@op
def Upsample(node, x, scales=None):
    scales = node.attr("scales") if scales is None else _floats(scales)
    return _resize(node, x, resize.upsample_how(node), [float(s) for s in scales])


# -- sampling ------------------------------------------------------------------------------------
_GRID_MODES = {"linear": "bilinear", "bilinear": "bilinear", "nearest": "nearest",
               "cubic": "bicubic", "bicubic": "bicubic"}


@op
def GridSample(node, x, grid):
    mode = _GRID_MODES[node.attr("mode", "linear" if node.opset >= 20 else "bilinear")]
    if x.dim() != 4 and mode == "bicubic" or x.dim() not in (4, 5):
        raise node.unsupported(f"{mode} sampling of a {x.dim()}-D input")
    return F.grid_sample(x, grid, mode=mode, padding_mode=node.attr("padding_mode", "zeros"),
                         align_corners=bool(node.attr("align_corners", 0)))


@op
def Col2Im(node, x, image_shape, block_shape):
    image, block = ints(image_shape), ints(block_shape)
    n = len(image)
    flat, valid = resize.col2im(image, block, node.attr("dilations") or [1] * n,
                                node.attr("strides") or [1] * n, node.attr("pads") or [0] * (2 * n))
    batch, channels = x.shape[0], x.shape[1] // math.prod(block)
    cols = x.reshape(batch, channels, -1)[..., torch.as_tensor(valid, device=x.device)]
    out = x.new_zeros(batch, channels, math.prod(image))
    out = out.index_add(2, torch.as_tensor(flat[valid], device=x.device), cols)
    return out.reshape(batch, channels, *image)


@op
def ImageDecoder(node, encoded):
    pixels = host_ops.decode_image(encoded.cpu().numpy().tobytes(),
                                   node.attr("pixel_format", "RGB"))
    return torch.from_numpy(pixels).to(encoded.device)
