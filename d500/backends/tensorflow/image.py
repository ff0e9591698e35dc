"""Image operators in TensorFlow: Resize/Upsample as products with the shared per-axis
interpolation matrices (d500.backends.resize, computed while tracing), GridSample, Col2Im, ..."""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from d500.backends import host_ops, resize, sampling
from d500.backends.graph import registry
from d500.backends.tensorflow.core import ints, static

OPS, op = registry()


def _resize(node, x, how, scales, sizes=None, roi=None):
    work = x if x.dtype in (tf.float32, tf.float64) else tf.cast(x, tf.float32)
    rank = x.shape.rank
    mask = None
    for a, w, outside in resize.plan(x.shape.as_list(), how, scales, sizes, roi,
                                     node.attr("axes")):
        moved = tf.experimental.numpy.moveaxis(work, a, -1)
        moved = tf.tensordot(moved, tf.constant(w, work.dtype), [[rank - 1], [1]])
        work = tf.experimental.numpy.moveaxis(moved, -1, a)
        if outside is not None:
            m = outside.reshape([-1 if k == a else 1 for k in range(rank)])
            mask = m if mask is None else (mask | m)
    if mask is not None:
        work = tf.where(tf.constant(mask), tf.cast(how["extrapolation_value"], work.dtype), work)
    if work.dtype != x.dtype:
        if x.dtype.is_integer:
            work = tf.clip_by_value(tf.round(work), float(x.dtype.min), float(x.dtype.max))
        work = tf.cast(work, x.dtype)
    return work


def _floats(x):
    value = static(x)
    return None if value is None or value.size == 0 else value.astype(np.float64).tolist()


@op
def Resize(node, x, roi=None, scales=None, sizes=None):
    if node.opset < 11:  # Resize-10: (X, scales)
        scales, roi = roi, None
    sc = _floats(scales)
    sz = None if sizes is None else ints(sizes, node, "sizes")
    if sc is None and sz is None:
        raise node.unsupported("Resize needs static scales or sizes")
    return _resize(node, x, resize.how(node), sc, sz, _floats(roi))


@op
def Upsample(node, x, scales=None):
    sc = node.attr("scales") if scales is None else static(scales).tolist()
    return _resize(node, x, resize.upsample_how(node), [float(s) for s in sc])


_KIT = sampling.Kit(
    floor=tf.floor, round=tf.round, where=tf.where, clip=tf.clip_by_value,
    mod=tf.math.floormod, ones_like=tf.ones_like, true_like=lambda x: tf.ones_like(x, tf.bool),
    index=lambda x: tf.cast(x, tf.int32))


@op
def GridSample(node, x, grid):
    """Sample x at grid's normalized coordinates: nearest, (bi)linear or (bi)cubic, N-D."""
    dims = x.shape.as_list()[2:]
    r = len(dims)
    xl = tf.transpose(x, [0, *range(2, r + 2), 1])  # [N, *dims, C]
    g = tf.cast(grid, tf.float32) if grid.dtype != tf.float64 else grid
    taps = sampling.taps(_KIT, g, dims, sampling.mode(node), node.attr("padding_mode", "zeros"),
                         node.attr("align_corners", 0))
    out = None
    for index, weight, valid in sampling.combinations(taps):
        values = tf.gather_nd(xl, tf.stack(index, -1), batch_dims=1)  # [N, *out, C]
        term = values * tf.cast(tf.where(valid, weight, tf.zeros_like(weight)),
                                x.dtype)[..., tf.newaxis]
        out = term if out is None else out + term
    return tf.transpose(out, [0, r + 1, *range(1, r + 1)])


@op
def NonMaxSuppression(node, boxes, scores, max_boxes=None, iou=None, score_threshold=None):
    """Greedy NMS per batch and class (tf.image.non_max_suppression): [batch, class, box] rows."""
    limit = 0 if max_boxes is None else int(np.asarray(static(max_boxes)).reshape(-1)[0])
    iou_t = 0.0 if iou is None else tf.reshape(tf.cast(iou, tf.float32), [])
    score_t = float("-inf") if score_threshold is None else tf.reshape(
        tf.cast(score_threshold, tf.float32), [])
    b = tf.cast(boxes, tf.float32)
    if node.attr("center_point_box", 0):
        cx, cy, w, h = tf.unstack(b, axis=-1)
        b = tf.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], -1)
    rows = []
    n_batch, n_class = scores.shape[0], scores.shape[1]
    for i in range(n_batch):
        for c in range(n_class):
            if limit <= 0:
                continue
            s = tf.cast(scores[i, c], tf.float32)
            picked = tf.image.non_max_suppression(b[i], s, limit, iou_t, score_t)
            keep = tf.gather(s, picked) > score_t  # ONNX drops scores equal to the threshold
            picked = tf.cast(tf.boolean_mask(picked, keep), tf.int64)
            lead = tf.constant([i, c], tf.int64)[tf.newaxis] * tf.ones_like(picked)[:, tf.newaxis]
            rows.append(tf.concat([lead, picked[:, tf.newaxis]], 1))
    if not rows:
        return tf.zeros([0, 3], tf.int64)
    return tf.concat(rows, 0)


@op
def ImageDecoder(node, encoded):
    """Decode an encoded image (JPEG, PNG, BMP, ...) to HWC uint8: RGB, BGR or Grayscale."""
    fmt = node.attr("pixel_format", "RGB")
    raw = tf.numpy_function(lambda a: np.asarray(a, np.uint8).tobytes(), [encoded], tf.string,
                            stateful=False)
    raw = tf.reshape(raw, [])

    def decode():
        return tf.cond(tf.io.is_jpeg(raw),
                       lambda: tf.io.decode_jpeg(raw, 3, dct_method="INTEGER_ACCURATE"),
                       lambda: tf.io.decode_image(raw, 3, expand_animations=False))
    if fmt == "Grayscale":
        rgb = decode()
        w = tf.constant([299, 587, 114], tf.int32)  # ITU-R 601-2 luma, as Pillow's "L"
        gray = (tf.reduce_sum(tf.cast(rgb, tf.int32) * w, -1, keepdims=True) + 500) // 1000
        return tf.cast(gray, tf.uint8)
    img = decode()
    return img[..., ::-1] if fmt == "BGR" else img


@op
def Col2Im(node, data, image_shape, block_shape):
    """Sum column blocks back into an image: a scatter-add with statically computed indices."""
    image = ints(image_shape, node, "image_shape")
    kernel = ints(block_shape, node, "block_shape")
    n = len(image)
    flat, valid = resize.col2im(image, kernel, node.attr("dilations") or [1] * n,
                                node.attr("strides") or [1] * n, node.attr("pads") or [0] * (2 * n))
    size = math.prod(image)
    segments = np.where(valid, flat, size)  # padding adds to one extra segment, dropped
    batch, rows, length = data.shape.as_list()
    channels = rows // math.prod(kernel)
    d = tf.transpose(tf.reshape(data, [batch, channels, rows // channels * length]), [2, 0, 1])
    summed = tf.math.unsorted_segment_sum(d, tf.constant(segments), size + 1)
    return tf.reshape(tf.transpose(summed[:-1], [1, 2, 0]), [batch, channels, *image])


@op
def MaxUnpool(node, x, indices, output_shape=None):
    """Values scattered to their indices in the inferred shape, zero-padded to output_shape."""
    shape = x.shape.as_list()
    n = len(shape) - 2
    k = node.attr("kernel_shape")
    s = node.attr("strides") or [1] * n
    p = node.attr("pads") or [0] * (2 * n)
    inferred = shape[:2] + [(shape[i + 2] - 1) * s[i] + k[i] - p[i] - p[i + n] for i in range(n)]
    flat = tf.scatter_nd(tf.reshape(tf.cast(indices, tf.int64), [-1, 1]), tf.reshape(x, [-1]),
                         [int(np.prod(inferred))])
    y = tf.reshape(flat, inferred)
    if output_shape is not None:
        out = ints(output_shape, node, "output_shape")
        y = tf.pad(y, [[0, o - i] for o, i in zip(out, inferred)])
    return y


@op
def TensorScatter(node, past, update, write_indices=None):
    """Write `update` into the cache `past` along `axis` from each batch row's write index."""
    r = past.shape.rank
    axis = node.attr("axis", -2)
    axis = axis + r if axis < 0 else axis
    perm = [0, axis] + [i for i in range(1, r) if i != axis]
    inv = np.argsort(perm).tolist()
    cache, upd = tf.transpose(past, perm), tf.transpose(update, perm)
    batch, length, steps = cache.shape[0], cache.shape[1], upd.shape[1]
    start = (tf.zeros([batch], tf.int64) if write_indices is None
             else tf.cast(write_indices, tf.int64))
    pos = start[:, None] + tf.range(steps, dtype=tf.int64)[None, :]
    if node.attr("mode", "linear") == "circular":
        pos = tf.math.floormod(pos, length)
    rows = tf.broadcast_to(tf.range(batch, dtype=tf.int64)[:, None], [batch, steps])
    out = tf.tensor_scatter_nd_update(cache, tf.stack([rows, pos], -1), upd)
    return tf.transpose(out, inv)


@op
def RoiAlign(node, x, rois, batch_indices):
    """Average or max of bilinear samples per bin; regions are baked (they decide the grids)."""
    regions, batch = static(rois), static(batch_indices)
    if regions is None or batch is None:
        raise node.unsupported("the regions must be known when the graph is traced")
    mode = node.attr("mode", "avg")
    n, c, h, w = x.shape.as_list()
    pooled, samples = host_ops.roi_align(node, (h, w))
    data = tf.reshape(x, [n, c, h * w])
    outs = []
    for roi, b in zip(regions, np.asarray(batch).reshape(-1)):
        pos, weights, count = samples(roi)
        if count == 0:
            outs.append(tf.zeros([c, *pooled], x.dtype))
            continue
        vals = tf.gather(data[int(b)], pos.reshape(-1), axis=1)
        vals = tf.reshape(vals, [c, *pos.shape]) * tf.constant(weights, x.dtype)
        if mode == "avg":
            outs.append(tf.reduce_sum(vals, [3, 4, 5]) / count)
        else:
            outs.append(tf.reduce_max(tf.reduce_max(vals, -1), [3, 4]))
    return tf.stack(outs) if outs else tf.zeros([0, c, *pooled], x.dtype)
