"""Shape, layout, indexing and tensor-creation operators in TensorFlow."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import tensorflow as tf
from tensorflow.python.framework import dtypes as _dtypes

from d500.backends.graph import registry
from d500.backends.tensorflow.core import (
    NARROW,
    ChannelsLast,
    attr_or_input,
    ints,
    norm_axes,
    norm_axis,
    plain,
    shape_list,
    static,
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


def _onnx_type_of(node, name):
    t = node.program.types.get(name) if node.program is not None else None
    return t.tensor_type.elem_type if t is not None and t.HasField("tensor_type") else None


def _cast(node, x, to):
    dtype = tf_dtype(to, node)
    if x.dtype == dtype:
        return x
    if dtype in NARROW or x.dtype in NARROW:
        return _narrow_cast(node, x, dtype)
    if dtype == tf.string:
        if x.dtype.is_floating:
            return _float_to_string(x)
        return tf.strings.as_string(x)
    if x.dtype == tf.string:
        if dtype == tf.bool:
            return tf.strings.to_number(x, tf.float64) != 0
        wide = tf.float64 if dtype.is_floating else tf.int64
        return tf.cast(tf.strings.to_number(x, wide), dtype)
    if x.dtype.is_floating and dtype.is_integer:
        x = tf.where(tf.math.is_finite(x), x, tf.zeros_like(x))  # NaN/inf: undefined in ONNX
    if x.dtype == tf.bfloat16 or dtype == tf.bfloat16:
        return tf.cast(tf.cast(x, tf.float32), dtype)
    return tf.cast(x, dtype)


def _narrow_cast(node, x, dtype):
    """Casts to/from float8, int4, float4: TF's own kernels where they exist, else ml_dtypes."""
    saturate = node.attr("saturate", 1)
    if dtype in NARROW and dtype.is_floating and saturate and x.dtype != tf.string:
        limit = float(ml_dtypes.finfo(dtype.as_numpy_dtype).max)
        x = tf.cast(x, tf.float32) if x.dtype in NARROW else x
        x = tf.where(tf.math.is_nan(x), x, tf.clip_by_value(x, -limit, limit))
    if x.dtype == tf.string:
        x = _cast(node, x, onnx.TensorProto.FLOAT)
    if dtype == tf.string:
        return _cast(node, _narrow_cast(node, x, tf.float32), onnx.TensorProto.STRING)
    native = {_dtypes.float8_e4m3fn, _dtypes.float8_e5m2}
    if (dtype in native and x.dtype in (tf.float32, tf.float16, tf.bfloat16)) or (
            x.dtype in native and dtype in (tf.float32, tf.float16, tf.bfloat16)):
        return tf.cast(x, dtype)
    target = dtype.as_numpy_dtype
    return tf.numpy_function(lambda a: np.asarray(a).astype(target), [x], dtype, stateful=False)


def _float_to_string(x):
    def fmt(a):
        flat = np.asarray(a).reshape(-1)
        return np.array([str(np.float32(v)) if a.dtype == np.float32 else str(v)
                         for v in flat], dtype=object).reshape(np.shape(a)).astype(bytes)
    return tf.numpy_function(fmt, [x], tf.string, stateful=False)


@op
def BitCast(node, x):
    to = tf_dtype(node.attr("to"), node)
    if x.dtype == tf.bool or to == tf.bool:  # one byte either way: 0 or 1
        return tf.cast(x, to)
    return tf.bitcast(x, to)


@op
def Cast(node, x):
    return _cast(node, x, node.attr("to"))


@op
def CastLike(node, x, like):
    return _cast(node, x, onnx_dtype_of(like))


def onnx_dtype_of(x):
    from d500.backends.tensorflow.core import onnx_dtype
    return onnx_dtype(x.dtype)


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
def Gather(node, x, indices):
    axis = norm_axis(node.attr("axis", 0), x.shape.rank)
    size = tf.shape(x, out_type=indices.dtype)[axis]
    indices = tf.where(indices < 0, indices + size, indices)
    return tf.gather(x, indices, axis=axis)


def _element_coords(node, x, indices):
    """Full coordinates of each element of GatherElements/ScatterElements: `indices` on `axis`."""
    axis = norm_axis(node.attr("axis", 0), x.shape.rank)
    size = tf.shape(x, out_type=indices.dtype)[axis]
    indices = tf.cast(tf.where(indices < 0, indices + size, indices), tf.int64)
    grids = tf.meshgrid(*[tf.range(d, dtype=tf.int64) for d in shape_list(indices)],
                        indexing="ij")
    grids[axis] = indices
    return tf.stack(grids, -1)


@op
def GatherElements(node, x, indices):
    return tf.gather_nd(x, _element_coords(node, x, indices))


@op
def GatherND(node, x, indices):
    b = node.attr("batch_dims", 0)
    shape = tf.shape(x, out_type=indices.dtype)
    k = indices.shape[-1]
    dims = shape[b:b + k]
    indices = tf.where(indices < 0, indices + dims, indices)
    return tf.gather_nd(x, indices, batch_dims=b)


def _scatter(x, idx, upd, reduction):
    if reduction in (None, "none"):
        return tf.tensor_scatter_nd_update(x, idx, upd)
    fn = {"add": tf.tensor_scatter_nd_add, "max": tf.tensor_scatter_nd_max,
          "min": tf.tensor_scatter_nd_min}.get(reduction)
    if fn is not None:
        return fn(x, idx, upd)
    if reduction == "mul":  # sequential product over (possibly repeated) indices
        n = idx.shape[0]
        for i in range(n):
            cur = tf.gather_nd(x, idx[i:i + 1])
            x = tf.tensor_scatter_nd_update(x, idx[i:i + 1], cur * upd[i:i + 1])
        return x
    raise ValueError(reduction)


@op
def ScatterND(node, x, indices, updates):
    indices = tf.cast(indices, tf.int64)
    shape = tf.shape(x, out_type=tf.int64)[:indices.shape[-1]]
    indices = tf.where(indices < 0, indices + shape, indices)
    reduction = node.attr("reduction", "none")
    if reduction == "mul":
        k = indices.shape[-1]
        flat_i = tf.reshape(indices, [-1, k])
        flat_u = tf.reshape(updates, [-1, *updates.shape[indices.shape.rank - 1:]])
        return _scatter(x, flat_i, flat_u, reduction)
    return _scatter(x, indices, updates, reduction)


@op(names=("ScatterElements", "Scatter"))  # Scatter (opset 9-10): ScatterElements, no reduction
def ScatterElements(node, x, indices, updates):
    idx = tf.reshape(_element_coords(node, x, indices), [-1, x.shape.rank])
    return _scatter(x, idx, tf.reshape(updates, [-1]), node.attr("reduction", "none"))



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
    b = node.attr("blocksize")
    n, c, h, w = shape_list(x)
    if node.attr("mode", "DCR") == "DCR":
        t = tf.reshape(x, [n, b, b, c // (b * b), h, w])
        t = tf.transpose(t, [0, 3, 4, 1, 5, 2])
    else:
        t = tf.reshape(x, [n, c // (b * b), b, b, h, w])
        t = tf.transpose(t, [0, 1, 4, 2, 5, 3])
    return tf.reshape(t, [n, c // (b * b), h * b, w * b])


@op
def SpaceToDepth(node, x):
    b = node.attr("blocksize")
    n, c, h, w = shape_list(x)
    t = tf.reshape(x, [n, c, h // b, b, w // b, b])
    crd = node.attr("mode", "DCR") == "CRD"
    t = tf.transpose(t, [0, 1, 3, 5, 2, 4] if crd else [0, 3, 5, 1, 2, 4])
    return tf.reshape(t, [n, c * b * b, h // b, w // b])


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
def OneHot(node, indices, depth, values):
    axis = node.attr("axis", -1)
    axis = axis + indices.shape.rank + 1 if axis < 0 else axis
    d = int(np.asarray(static(depth)).reshape(-1)[0])
    idx = tf.cast(indices, tf.int64)
    idx = tf.where(idx < 0, idx + d, idx)
    return tf.one_hot(idx, d, on_value=values[1], off_value=values[0], axis=axis)


@op
def NonZero(node, x):
    return tf.transpose(tf.where(tf.cast(x, tf.bool) if x.dtype != tf.bool else x))


@op
def TopK(node, x, k):
    axis = norm_axis(node.attr("axis", -1), x.shape.rank)
    k = ints(k, node, "k")[0] if node.opset >= 10 else node.attr("k")
    largest = node.attr("largest", 1)
    r = x.shape.rank
    perm = [i for i in range(r) if i != axis] + [axis]
    inv = np.argsort(perm).tolist()
    t = tf.transpose(x, perm)
    # stable order: ties keep the smaller index first, as ONNX
    idx = tf.argsort(t, axis=-1, direction="DESCENDING" if largest else "ASCENDING",
                     stable=True)[..., :k]
    vals = tf.gather(t, idx, batch_dims=r - 1)
    return tf.transpose(vals, inv), tf.cast(tf.transpose(idx, inv), tf.int64)


@op
def Trilu(node, x, k=None):
    k = 0 if k is None else ints(k, node, "k")[0]
    n, m = shape_list(x)[-2:]
    rows = tf.range(n, dtype=tf.int64)[:, tf.newaxis]
    cols = tf.range(m, dtype=tf.int64)[tf.newaxis, :]
    keep = cols - rows >= k if node.attr("upper", 1) else cols - rows <= k
    return tf.where(keep, x, tf.zeros_like(x))


@op
def Compress(node, x, condition):
    axis = node.attr("axis")
    cond = tf.cast(condition, tf.bool)
    if axis is None:
        x = tf.reshape(x, [-1])
        axis = 0
    axis = norm_axis(axis, x.shape.rank)
    n, m = x.shape[axis], cond.shape[0]
    if n is not None and m is not None:
        cond = cond[:n] if m > n else tf.concat([cond, tf.zeros([n - m], tf.bool)], 0)
    return tf.boolean_mask(x, cond, axis=axis)


@op
def ReverseSequence(node, x, lengths):
    return tf.reverse_sequence(x, lengths, seq_axis=node.attr("time_axis", 0),
                               batch_axis=node.attr("batch_axis", 1))


@op
def Unique(node, x):
    """Unique values (sorted unless sorted=0), first indices, inverse indices and counts."""
    axis = node.attr("axis")
    srt = node.attr("sorted", 1)

    def unique(a):
        flat = np.asarray(a).reshape(-1) if axis is None else np.asarray(a)
        values, first, inverse, counts = np.unique(flat, return_index=True,
                                                   return_inverse=True, return_counts=True,
                                                   axis=axis)
        if not srt:
            order = np.argsort(first, kind="stable")
            rank = np.empty_like(order)
            rank[order] = np.arange(len(order))
            values = values[order] if axis is None else np.take(values, order, axis=axis)
            first, counts, inverse = first[order], counts[order], rank[inverse]
        return (values.astype(flat.dtype), first.astype(np.int64),
                inverse.reshape(-1).astype(np.int64), counts.astype(np.int64))
    out = tf.numpy_function(unique, [x], [x.dtype, tf.int64, tf.int64, tf.int64],
                            stateful=False)
    return tuple(out)


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

