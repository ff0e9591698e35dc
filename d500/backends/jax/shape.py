"""Shape and layout JAX ops: constants, Shape/Size, reshapes, concatenation, slicing, padding,
depth/space moves. String tensors (NumPy, known while tracing) go through NumPy."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from d500.backends import shapes
from d500.backends.graph import registry
from d500.backends.jax.core import dtype_of, ints, norm_axis, static

OPS, op = registry()


def xp(*xs):
    """NumPy for string tensors, jax.numpy for the rest."""
    return np if any(isinstance(x, np.ndarray) and x.dtype.kind in "OUS" for x in xs) else jnp


# -- constants and identities ------------------------------------------------------------------
@op
def Constant(node):
    for key, kind in (("value_float", np.float32), ("value_floats", np.float32),
                      ("value_int", np.int64), ("value_ints", np.int64)):
        if key in node.attrs:
            return jnp.asarray(np.asarray(node.attrs[key], dtype=kind))
    if "value" in node.attrs:
        value = node.attrs["value"]
        return value if value.dtype.kind in "OUS" else jnp.asarray(value)
    if "value_string" in node.attrs or "value_strings" in node.attrs:
        return np.asarray(node.attrs.get("value_string", node.attrs.get("value_strings")),
                          dtype=object)
    raise node.unsupported("only dense tensor and scalar constants")


@op
def Identity(node, x):
    return x


@op
def Shape(node, x):
    shape = list(x.shape)
    start, end = node.attr("start", 0), node.attr("end")
    return jnp.asarray(np.array(shape[start:end], dtype=np.int64))


@op
def Size(node, x):
    return jnp.asarray(np.int64(math.prod(x.shape)))


@op
def ConstantOfShape(node, shape):
    value = node.attr("value")
    if value is None:
        value = np.zeros(1, dtype=np.float32)
    return jnp.full(ints(shape, "shape"), value.reshape(()), dtype=value.dtype)


@op
def Range(node, start, limit, delta):
    s, lim, d = static(start), static(limit), static(delta)
    if s is None or lim is None or d is None:
        from d500.backends.jax.core import NotStatic
        raise NotStatic("start, limit and delta")
    count = max(math.ceil((lim.item() - s.item()) / d.item()), 0)
    return start + jnp.arange(count, dtype=start.dtype) * delta


@op
def EyeLike(node, x):
    dtype = node.attr("dtype")
    target = dtype_of(dtype, node) if dtype is not None else x.dtype
    return jnp.eye(x.shape[0], x.shape[1], k=node.attr("k", 0), dtype=target)


# -- reshaping ------------------------------------------------------------------------------------
@op
def Reshape(node, x, shape=None):
    target = ints(shape, "shape") if shape is not None else list(node.attr("shape"))
    if not node.attr("allowzero", 0):
        target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
    return x.reshape(target)


@op
def Flatten(node, x):
    axis = norm_axis(node.attr("axis", 1), x.ndim)
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


@op
def Transpose(node, x):
    perm = node.attr("perm")
    return x.transpose(perm if perm is not None else tuple(reversed(range(x.ndim))))


def _axes(node, axes):
    if node.opset < 13 and node.attr("axes") is not None:
        return list(node.attr("axes"))
    return None if axes is None else ints(axes, "axes")


@op
def Squeeze(node, x, axes=None):
    axes = _axes(node, axes)
    if axes is None:
        return xp(x).squeeze(x)
    return xp(x).squeeze(x, tuple(norm_axis(a, x.ndim) for a in axes)) if axes else x


@op
def Unsqueeze(node, x, axes=None):
    axes = _axes(node, axes)
    rank = x.ndim + len(axes)
    return xp(x).expand_dims(x, tuple(sorted(norm_axis(a, rank) for a in axes)))


@op
def Expand(node, x, shape):
    target = np.broadcast_shapes(tuple(x.shape), tuple(ints(shape, "shape")))
    return xp(x).broadcast_to(x, target)


@op
def Tile(node, x, repeats):
    return xp(x).tile(x, ints(repeats, "repeats"))


@op
def Concat(node, *xs):
    return xp(*xs).concatenate(xs, axis=node.attr("axis"))


@op
def Split(node, x, split=None):
    axis = norm_axis(node.attr("axis", 0), x.ndim)
    sizes = shapes.split_sizes(node, x.shape[axis],
                               ints(split, "split") if split is not None else None)
    cuts = np.cumsum(sizes)[:-1].tolist()
    return tuple(xp(x).split(x, cuts, axis=axis))


@op
def Slice(node, x, starts=None, ends=None, axes=None, steps=None):
    if node.opset >= 10:
        starts, ends = ints(starts, "starts"), ints(ends, "ends")
        axes = None if axes is None else ints(axes, "axes")
        steps = None if steps is None else ints(steps, "steps")
    index: list = [slice(None)] * x.ndim
    for axis, first, stop, step in shapes.slices(node, x.shape, starts, ends, axes, steps):
        index[axis] = slice(first, None if step < 0 and stop < 0 else stop, step)
    return x[tuple(index)]


# -- padding ---------------------------------------------------------------------------------------
_PAD_MODES = {"constant": "constant", "edge": "edge", "reflect": "reflect", "wrap": "wrap"}


@op
def Pad(node, x, pads=None, value=None, axes=None):
    if node.opset < 11:
        pads, mode, fill = list(node.attr("pads")), node.attr("mode", "constant"), node.attr(
            "value", 0.0)
    else:
        pads, mode = ints(pads, "pads"), node.attr("mode", "constant")
        fill = 0 if value is None or value.size == 0 else value.reshape(())
    widths = shapes.pad_widths(pads, None if axes is None else ints(axes, "axes"), x.ndim)
    # negative pads crop
    crop = tuple(slice(max(-b, 0), x.shape[a] - max(-e, 0)) for a, (b, e) in enumerate(widths))
    x = x[crop]
    widths = [(max(b, 0), max(e, 0)) for b, e in widths]
    if mode == "constant":
        fill = jnp.asarray(fill).astype(x.dtype) if not isinstance(fill, float) else fill
        return jnp.pad(x, widths, mode="constant", constant_values=fill)
    return jnp.pad(x, widths, mode=_PAD_MODES[mode])


# -- depth and space ---------------------------------------------------------------------------
@op
def DepthToSpace(node, x):
    blocks, perm, out = shapes.depth_to_space(node, x.shape)
    return x.reshape(blocks).transpose(perm).reshape(out)


@op
def SpaceToDepth(node, x):
    blocks, perm, out = shapes.space_to_depth(node, x.shape)
    return x.reshape(blocks).transpose(perm).reshape(out)
