"""Convolution operators in TensorFlow (Conv, ConvTranspose, DeformConv); Conv's window geometry
is the shared `windows`.

ONNX is channels-first (NCHW); TensorFlow's CPU kernels are channels-last. Convolution and
pooling therefore return `ChannelsLast` values (NHWC inside), which the layout-aware operators
and the elementwise ones keep (see ops.py), so a network transposes once on the way in
and once on the way out instead of around every convolution.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from d500.backends.graph import registry
from d500.backends.tensorflow.core import ChannelsLast, plain, shape_list, to_last
from d500.backends.windows import window_geometry

OPS, op = registry()


def rank_of(x):
    """The rank of x, a tensor or a ChannelsLast value."""
    return x.t.shape.rank if isinstance(x, ChannelsLast) else x.shape.rank


def spatial_of(x):
    """The spatial dimensions of x, a tensor (N, C, ...) or a ChannelsLast value."""
    return x.t.shape[1:-1] if isinstance(x, ChannelsLast) else x.shape[2:]


def _dtype(x):
    return x.t.dtype if isinstance(x, ChannelsLast) else x.dtype


def _tf_same(spatial, kernel, strides, dilations):
    """The (begin, end) pads of TensorFlow's padding="SAME" for this geometry."""
    pads = []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        pads.append((total // 2, total - total // 2))
    return pads


def _conv_nhwc(x, w, strides, dilations, groups, pads):
    """Channels-last convolution with (begin, end) pads; w is [*k, cin/groups, cout].

    Pads that TF's "SAME" gives are passed as "SAME" (the fastest kernels, forward and
    backward); other pads become an explicit tf.pad and "VALID".
    """
    cin, n = x.shape[-1], len(strides)
    pads = [tuple(p) for p in pads]
    if not any(any(p) for p in pads):
        padding = "VALID"
    elif pads == _tf_same(x.shape[1:-1], w.shape[:n], strides, dilations):
        padding = "SAME"
    else:
        x, padding = tf.pad(x, [(0, 0), *pads, (0, 0)]), "VALID"
    if groups == 1:
        return tf.nn.convolution(x, w, strides=strides, dilations=dilations, padding=padding)
    if n == 2 and groups == cin and w.shape[-1] % groups == 0 and strides[0] == strides[1]:
        dw = tf.reshape(w, [*w.shape[:2], groups, w.shape[-1] // groups])
        return tf.nn.depthwise_conv2d(x, dw, [1, *strides, 1], padding, dilations=dilations)
    xs = tf.split(x, groups, axis=-1)
    ws = tf.split(w, groups, axis=-1)
    return tf.concat([tf.nn.convolution(a, b, strides=strides, dilations=dilations,
                                        padding=padding) for a, b in zip(xs, ws)], -1)


def conv(node, x, w, b=None, pads=None):
    """ONNX Conv (NC...) through TensorFlow's channels-last kernels."""
    n = rank_of(x) - 2
    kernel = w.shape[2:]
    strides, dilations, begin, end = window_geometry(node, spatial_of(x), list(kernel))
    groups = node.attr("group", 1)
    if pads is None:
        pads = list(zip(begin, end))
    if _dtype(x) not in (tf.float32, tf.float64, tf.float16, tf.bfloat16):
        raise node.unsupported(f"convolution of {_dtype(x).name}")
    xl = to_last(x)
    if xl.dtype in (tf.float16, tf.bfloat16):  # accumulate in float32, round once
        half = xl.dtype
        y = conv(node, ChannelsLast(tf.cast(xl, tf.float32)), tf.cast(w, tf.float32),
                 None if b is None else tf.cast(b, tf.float32), pads)
        return ChannelsLast(tf.cast(y.t, half))
    wl = tf.transpose(w, [*range(2, n + 2), 1, 0])  # [*k, cin/g, cout]
    if n == 1:  # TF has no 1-D kernels of its own: go through 2-D
        y = _conv_nhwc(xl[:, tf.newaxis], wl[tf.newaxis], [1, *strides], [1, *dilations],
                       groups, [(0, 0), *pads])[:, 0]
    else:
        y = _conv_nhwc(xl, wl, list(strides), list(dilations), groups, list(pads))
    if b is not None:
        y = y + b
    return ChannelsLast(y)


@op
def Conv(node, x, w, b=None):
    return conv(node, x, w, b)


@op
def ConvTranspose(node, x, w, b=None):
    """A strided transposed convolution as a convolution of the zero-upsampled input."""
    n = x.shape.rank - 2
    groups = node.attr("group", 1)
    kernel = w.shape[2:]
    strides = node.attr("strides") or [1] * n
    dilations = node.attr("dilations") or [1] * n
    out_pad = node.attr("output_padding") or [0] * n
    spatial = x.shape[2:]
    full = [(i - 1) * s + (k - 1) * d + 1 + op
            for i, s, k, d, op in zip(spatial, strides, kernel, dilations, out_pad)]
    pads = node.attr("pads")
    out_shape = node.attr("output_shape")
    auto = node.attr("auto_pad", "NOTSET")
    if out_shape:
        out_shape = list(out_shape)[-n:]
        totals = [f - o for f, o in zip(full, out_shape)]
        upper = auto == "SAME_UPPER"
        pads = [(t // 2, t - t // 2) if upper else (t - t // 2, t // 2) for t in totals]
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        totals = [f - i * s for f, i, s in zip(full, spatial, strides)]
        pads = [(t // 2, t - t // 2) if auto == "SAME_UPPER" else (t - t // 2, t // 2)
                for t in totals]
    elif pads:
        pads = [(int(pads[i]), int(pads[i + n])) for i in range(n)]
    else:
        pads = [(0, 0)] * n
    # upsample: insert s-1 zeros between input elements
    y = x
    for axis, s in enumerate(strides):
        if s > 1:
            ax = axis + 2
            shape = shape_list(y)
            z = tf.stack([y] + [tf.zeros_like(y)] * (s - 1), axis=ax + 1)
            shape[ax] = shape[ax] * s
            z = tf.reshape(z, shape)
            y = z[(slice(None),) * ax + (slice(0, shape[ax] - (s - 1)),)]
    # weights [cin, cout/g, *k] -> conv weights [cout, cin/g, *k], flipped
    cin, cout_g = w.shape[0], w.shape[1]
    wg = tf.reshape(w, [groups, cin // groups, cout_g, *kernel])
    wg = tf.transpose(wg, [0, 2, 1, *range(3, n + 3)])
    wc = tf.reverse(tf.reshape(wg, [groups * cout_g, cin // groups, *kernel]),
                    axis=list(range(2, n + 2)))
    conv_pads = [((k - 1) * d - pb, (k - 1) * d - pe + op)
                 for k, d, (pb, pe), op in zip(kernel, dilations, pads, out_pad)]
    crop = []
    for i, (pb, pe) in enumerate(conv_pads):  # negative pads crop the upsampled input
        crop.append((max(-pb, 0), max(-pe, 0)))
        conv_pads[i] = (max(pb, 0), max(pe, 0))
    if any(c != (0, 0) for c in crop):
        idx = [slice(None), slice(None)] + [
            slice(cb, (y.shape[i + 2] - ce)) for i, (cb, ce) in enumerate(crop)]
        y = y[tuple(idx)]

    class _Attrs:
        op_type, opset = node.op_type, node.opset

        def attr(self, name, default=None):
            return {"strides": [1] * n, "dilations": dilations, "group": groups}.get(
                name, default)

        unsupported = node.unsupported
    return conv(_Attrs(), y, wc, b, pads=conv_pads)


@op
def DeformConv(node, x, w, offset, b=None, mask=None):
    """2-D deformable convolution: bilinear samples at offset kernel taps, then a grouped matmul."""
    x = plain(x)
    if x.shape.rank != 4:
        raise node.unsupported("DeformConv other than 2-D")
    n, c, h, wd = x.shape.as_list()
    oc, cg, kh, kw = w.shape.as_list()
    k = kh * kw
    sh, sw = node.attr("strides") or [1, 1]
    dh, dw = node.attr("dilations") or [1, 1]
    pt, pl, pb, pr = node.attr("pads") or [0, 0, 0, 0]
    groups, og = node.attr("group", 1), node.attr("offset_group", 1)
    oh = (h + pt + pb - ((kh - 1) * dh + 1)) // sh + 1
    ow = (wd + pl + pr - ((kw - 1) * dw + 1)) // sw + 1
    ki, kj = np.meshgrid(np.arange(kh), np.arange(kw), indexing="ij")
    base_y = (np.arange(oh) * sh - pt)[None, :, None] + (ki.reshape(-1) * dh)[:, None, None]
    base_x = (np.arange(ow) * sw - pl)[None, None, :] + (kj.reshape(-1) * dw)[:, None, None]
    off = tf.reshape(offset, [n, og, k, 2, oh, ow])
    y = tf.constant(base_y, x.dtype) + off[:, :, :, 0]  # [n, og, k, oh, ow]
    xx = tf.constant(base_x, x.dtype) + off[:, :, :, 1]
    inside = (y > -1) & (y < h) & (xx > -1) & (xx < wd)
    y0, x0 = tf.floor(y), tf.floor(xx)
    ly, lx = y - y0, xx - x0
    data = tf.reshape(x, [n, og, c // og, h * wd])
    cols = 0
    for yy, xc, weight in ((y0, x0, (1 - ly) * (1 - lx)), (y0, x0 + 1, (1 - ly) * lx),
                           (y0 + 1, x0, ly * (1 - lx)), (y0 + 1, x0 + 1, ly * lx)):
        valid = inside & (yy >= 0) & (yy <= h - 1) & (xc >= 0) & (xc <= wd - 1)
        idx = tf.cast(tf.clip_by_value(yy, 0, h - 1) * wd + tf.clip_by_value(xc, 0, wd - 1),
                      tf.int32)
        vals = tf.gather(data, tf.reshape(idx, [n, og, -1]), axis=3, batch_dims=2)
        vals = tf.reshape(vals, [n, og, c // og, k, oh, ow])
        cols += vals * tf.where(valid, weight, tf.zeros_like(weight))[:, :, tf.newaxis]
    if mask is not None:
        cols *= tf.reshape(mask, [n, og, 1, k, oh, ow])
    cols = tf.reshape(cols, [n, groups, (c // groups) * k, oh * ow])
    wg = tf.reshape(w, [groups, oc // groups, cg * k])
    out = tf.reshape(tf.einsum("ngkp,gok->ngop", cols, wg), [n, oc, oh, ow])
    return out if b is None else out + tf.reshape(b, [1, -1, 1, 1])
