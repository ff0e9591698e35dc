"""NumPy VJPs of the shape and data-movement operators (reshapes, Transpose, Concat, Expand, and
Slice/Gather/Pad/... by routing the gradient back through element indices)."""

from __future__ import annotations

import numpy as np
import onnx

from d500.backends.graph import registry
from d500.backends.reference.table import Grad, Step, unbroadcast

VJP, op = registry()


@op(names=("Reshape", "Flatten", "Squeeze", "Unsqueeze"))
def _reshape_back(s: Step, g: list[Grad]) -> list[Grad]:
    return [np.asarray(g[0]).reshape(s.x[0].shape)] + [None] * (len(s.x) - 1)


@op
def Transpose(s: Step, g: list[Grad]) -> list[Grad]:
    perm = s.attr("perm") or list(range(s.x[0].ndim))[::-1]
    return [np.transpose(g[0], np.argsort(perm))]


@op
def Concat(s: Step, g: list[Grad]) -> list[Grad]:
    axis = s.attr("axis") % s.y[0].ndim
    cuts = np.cumsum([x.shape[axis] for x in s.x])[:-1]
    return list(np.split(np.asarray(g[0]), cuts, axis=axis))


@op
def Expand(s: Step, g: list[Grad]) -> list[Grad]:
    return [unbroadcast(g[0], s.x[0].shape), None]


@op(names=("Slice", "Gather", "Pad", "Tile", "Split", "DepthToSpace", "SpaceToDepth"))
def _route(s: Step, g: list[Grad]) -> list[Grad]:
    """Gradient of a pure data-movement op (Slice, Gather, Pad, Tile, Split, ...).

    The op is run on a tensor of (1 + element index) in place of its first input; each output
    element then names the input element it copies (0: a padding value), and the output
    gradients are scattered back through those indices.
    """
    from onnx.reference import ReferenceEvaluator

    from d500.backends.base import node_model
    x = s.x[0]
    index = np.arange(1, x.size + 1, dtype=np.int64).reshape(x.shape)
    others = list(s.x[1:])
    if s.node.op_type == "Pad" and len(others) > 1 and others[1] is not None:
        others[1] = np.zeros((), dtype=np.int64)  # constant_value: "not from x"
    node = onnx.NodeProto()
    node.CopyFrom(s.node)
    names = [f"in{i}" if n else "" for i, n in enumerate(node.input)]
    del node.input[:]
    node.input.extend(names)
    values = [v for v, n in zip([index, *others], names) if n]
    if node.op_type == "Pad" and s.attr("value") is not None:
        for a in node.attribute:
            if a.name == "value":
                a.f = 0.0
    routes = ReferenceEvaluator(node_model(node, values, opset=s.opset)).run(
        None, {n: v for n, v in zip([n for n in names if n], values)})
    gx = np.zeros(x.size, dtype=x.dtype)
    for r, gy in zip(routes, g):
        if gy is None:
            continue
        r = np.asarray(r).ravel()
        keep = r > 0
        np.add.at(gx, r[keep] - 1, np.asarray(gy, dtype=x.dtype).ravel()[keep])
    return [gx.reshape(x.shape)] + [None] * (len(s.x) - 1)
