"""Shape, layout and tensor-creation operators in TensorFlow: constants, Shape/Size, reshapes,
concatenation, slicing, padding, depth/space moves."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from d500.backends import shapes
from d500.backends.graph import registry
from d500.backends.tensorflow.core import (
    ChannelsLast,
    attr_or_input,
    ints,
    norm_axes,
    norm_axis,
    plain,
    shape_list,
    tensor,
    tf_dtype,
    to_last,
)

OPS, op = registry()


@op
def Identity(node, x):
    if isinstance(x, list):
        return list(x)
    return tf.identity(x) if isinstance(x, (tf.Tensor, tf.Variable)) else x


@op
def Constant(node):
    for key in ("value", "value_float", "value_int", "value_floats", "value_ints",
                "value_string", "value_strings"):
        value = node.attr(key)
        if value is not None:
            break
    else:
        raise node.unsupported("sparse constants")
    if key in ("value_float", "value_floats"):
        value = np.asarray(value, np.float32)
    elif key in ("value_int", "value_ints"):
        value = np.asarray(value, np.int64)
    return tensor(np.asarray(value))


@op
def Shape(node, x):
    r = x.shape.rank
    start = norm_axis(node.attr("start", 0), r)
    end = node.attr("end")
    end = r if end is None else norm_axis(end, r)
    part = slice(max(0, min(start, r)), max(0, min(end, r)))
    if x.shape.is_fully_defined():
        return tf.constant(x.shape.as_list()[part], tf.int64)
    return tf.shape(x, out_type=tf.int64)[part]


@op
def Size(node, x):
    if x.shape.is_fully_defined():
        return tf.constant(x.shape.num_elements(), tf.int64)
    return tf.size(x, out_type=tf.int64)


@op
def Reshape(node, x, shape=None):
    target = ints(shape, node, "shape") if node.opset >= 5 else list(node.attr("shape"))
    allow_zero = node.attr("allowzero", 0)
    current = shape_list(x)
    if not allow_zero:
        target = [current[i] if d == 0 else d for i, d in enumerate(target)]
    return tf.reshape(x, target)


@op
def Flatten(node, x):
    axis = norm_axis(node.attr("axis", 1), x.shape.rank)
    s = shape_list(x)
    outer = int(np.prod(s[:axis])) if all(isinstance(d, int) for d in s[:axis]) else -1
    return tf.reshape(x, [outer, -1] if outer != -1 else [tf.reduce_prod(s[:axis]), -1])


@op
def Squeeze(node, x, axes=None):
    axes = attr_or_input(node, "axes", axes)
    if axes is None:
        return tf.squeeze(x)
    return tf.squeeze(x, norm_axes(axes, x.shape.rank))


@op
def Unsqueeze(node, x, axes=None):
    axes = attr_or_input(node, "axes", axes)
    out_rank = x.shape.rank + len(axes)
    for a in sorted(norm_axes(axes, out_rank)):
        x = tf.expand_dims(x, a)
    return x


@op
def Transpose(node, x):
    perm = node.attr("perm")
    return tf.transpose(x, perm=None if perm is None else list(perm))


@op
def Concat(node, *xs):
    xs = [x for x in xs if x is not None]
    if any(isinstance(x, ChannelsLast) for x in xs):
        r = max(x.t.shape.rank for x in xs if isinstance(x, ChannelsLast))
        if norm_axis(node.attr("axis", 0), r) == 1 and all(
                isinstance(x, ChannelsLast) or x.shape.rank == r for x in xs):
            return ChannelsLast(tf.concat([to_last(x) for x in xs], -1))
        xs = [plain(x) for x in xs]
    return tf.concat(xs, norm_axis(node.attr("axis", 0), xs[0].shape.rank))


@op
def Split(node, x, split=None):
    axis = norm_axis(node.attr("axis", 0), x.shape.rank)
    split = attr_or_input(node, "split", split)
    n_out = len(node.outputs)
    if split is None:
        size = x.shape[axis]
        parts = node.attr("num_outputs", n_out)
        chunk = -(-size // parts)
        split = [chunk] * (size // chunk) + ([size % chunk] if size % chunk else [])
    return tuple(tf.split(x, list(split), axis=axis))


@op
def Slice(node, x, starts=None, ends=None, axes=None, steps=None):
    r = x.shape.rank
    if node.opset < 10:
        starts, ends, axes = node.attr("starts"), node.attr("ends"), node.attr("axes")
        steps = None
    else:
        starts, ends = ints(starts, node, "starts"), ints(ends, node, "ends")
        axes = None if axes is None else ints(axes, node, "axes")
        steps = None if steps is None else ints(steps, node, "steps")
    axes = list(range(len(starts))) if axes is None else norm_axes(axes, r)
    steps = steps or [1] * len(starts)
    index = [slice(None)] * r
    big = 2 ** 62
    for a, s, e, st in zip(axes, starts, ends, steps):
        s = None if (st > 0 and s <= -big) or (st < 0 and s >= big) else s
        e = None if (st > 0 and e >= big) or (st < 0 and e <= -big) else e
        if s is not None:
            s = max(min(s, big), -big)
        index[a] = slice(s, e, st)
    return x[tuple(index)]


@op
def Expand(node, x, shape):
    target = ints(shape, node, "shape")
    current = shape_list(x)
    r = max(len(target), len(current))
    target = [1] * (r - len(target)) + target
    current = [1] * (r - len(current)) + current
    out = [c if t == 1 else t for c, t in zip(current, target)]
    return tf.broadcast_to(x, out)


@op
def Tile(node, x, repeats):
    return tf.tile(x, ints(repeats, node, "repeats"))


@op
def Pad(node, x, pads=None, value=None, axes=None):
    r = x.shape.rank
    mode = node.attr("mode", "constant")
    if node.opset < 11:
        pads = list(node.attr("pads", node.attr("paddings")))
        value = node.attr("value", 0.0)
    else:
        pads = ints(pads, node, "pads")
        value = 0 if value is None else value
    if axes is not None:
        axes = norm_axes(ints(axes, node, "axes"), r)
    else:
        axes = list(range(r))
    n = len(axes)
    width = [[0, 0] for _ in range(r)]
    for i, a in enumerate(axes):
        width[a] = [pads[i], pads[i + n]]
    # negative pads crop
    crop = tuple(slice(max(-b, 0), (x.shape[i] - max(-e, 0)) if x.shape[i] is not None
                       else None) for i, (b, e) in enumerate(width))
    x = x[crop]
    width = [[max(b, 0), max(e, 0)] for b, e in width]
    if mode == "constant":
        return tf.pad(x, width, constant_values=tf.reshape(tf.cast(tensor(value), x.dtype), []))
    if mode == "edge":
        for a, (b, e) in enumerate(width):
            if b or e:
                first = tf.gather(x, [0] * b, axis=a)
                last = tf.gather(x, [x.shape[a] - 1] * e, axis=a)
                x = tf.concat([first, x, last], a)
        return x
    if mode == "wrap":
        for a, (b, e) in enumerate(width):
            size = x.shape[a]
            if b or e:
                idx = [(i % size) for i in range(-b, size + e)]
                x = tf.gather(x, idx, axis=a)
        return x
    return tf.pad(x, width, mode="REFLECT")


@op
def DepthToSpace(node, x):
    blocks, perm, out = shapes.depth_to_space(node, shape_list(x))
    return tf.reshape(tf.transpose(tf.reshape(x, blocks), perm), out)


@op
def SpaceToDepth(node, x):
    blocks, perm, out = shapes.space_to_depth(node, shape_list(x))
    return tf.reshape(tf.transpose(tf.reshape(x, blocks), perm), out)


@op
def ConstantOfShape(node, shape):
    value = node.attr("value")
    value = np.zeros(1, np.float32) if value is None else value
    dims = ints(shape, node, "shape")
    return tf.fill(dims, tf.constant(value.reshape(-1)[0]))


@op
def Range(node, start, limit, delta):
    if start.dtype in (tf.int16, tf.int8):
        return tf.cast(tf.range(tf.cast(start, tf.int32), tf.cast(limit, tf.int32),
                                tf.cast(delta, tf.int32)), start.dtype)
    return tf.range(start, limit, delta)


@op
def EyeLike(node, x):
    dtype = node.attr("dtype")
    dtype = x.dtype if dtype is None else tf_dtype(dtype, node)
    n, m = shape_list(x)
    k = node.attr("k", 0)
    rows = tf.range(n)[:, tf.newaxis]
    cols = tf.range(m)[tf.newaxis, :]
    return tf.cast(tf.equal(cols - rows, k), dtype)


@op
def CenterCropPad(node, x, shape):
    target = ints(shape, node, "shape")
    axes = node.attr("axes")
    axes = list(range(x.shape.rank)) if axes is None else norm_axes(axes, x.shape.rank)
    for a, t in zip(axes, target):
        size = x.shape[a]
        if size > t:
            start = (size - t) // 2
            x = tf.gather(x, list(range(start, start + t)), axis=a)
        elif size < t:
            before = (t - size) // 2
            width = [[0, 0] for _ in range(x.shape.rank)]
            width[a] = [before, t - size - before]
            x = tf.pad(x, width)
    return x
