"""Seeded random weights for models that generate theirs in the graph (the onnx package's light
models fill every weight with one constant through ConstantOfShape, so their outputs barely depend
on the input and agreement on them says little about the arithmetic).

`randomize(model, seed)` replaces each ConstantOfShape whose shape is a constant initializer and
whose value is a float by a seeded initializer: tensors of two or more dimensions (convolution and
dense weights) are LeCun-normal, N(0, 1 / fan_in) with fan_in = the product of all but the first
dimension; one-dimensional ones (biases, batch-norm scale, shift, mean and variance) are uniform
in [0.5, 1.5), positive so that a variance stays a variance. The architecture is unchanged.
(He-normal, N(0, 2 / fan_in), saturates the softmax of the deeper light models, because their
inference-mode batch norms do not renormalise; LeCun keeps 8 of the 9 outputs input-dependent.)
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


def randomize(model: onnx.ModelProto, seed: int = 0) -> tuple[onnx.ModelProto, int]:
    """A copy of `model` with in-graph constant weights made seeded initializers; and how many."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inits = {t.name: t for t in graph.initializer}
    rng = np.random.default_rng(seed)
    keep, new = [], []
    for node in graph.node:
        value = _replacement(node, inits, rng)
        if value is None:
            keep.append(node)
        else:
            new.append(numpy_helper.from_array(value, node.output[0]))
    if not new:
        return out, 0
    del graph.node[:]
    graph.node.extend(keep)
    graph.initializer.extend(new)
    _drop_unused(out)
    if out.ir_version < 4:  # before IR 4 every initializer must also be a graph input
        listed = {i.name for i in graph.input}
        for t in new:
            if t.name not in listed:
                graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, t.dims))
    return out, len(new)


def constant_weights(model: onnx.ModelProto) -> int:
    """How many weights `model` fills with one constant in the graph (what `randomize` replaces)."""
    inits = {t.name: t for t in model.graph.initializer}
    return sum(_constant_weight(node, inits) is not None for node in model.graph.node)


def _constant_weight(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]
                     ) -> tuple[list[int], np.dtype] | None:
    """Shape and dtype of a float ConstantOfShape with a constant shape; None for other nodes."""
    if node.op_type != "ConstantOfShape" or node.domain not in ("", "ai.onnx"):
        return None
    if not node.input or node.input[0] not in inits:
        return None
    shape = [int(d) for d in numpy_helper.to_array(inits[node.input[0]]).ravel()]
    fill = next((numpy_helper.to_array(a.t) for a in node.attribute if a.name == "value"), None)
    dtype = np.dtype(np.float32) if fill is None else fill.dtype
    if dtype.kind != "f" or any(d < 0 for d in shape):
        return None
    return shape, dtype


def _replacement(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto],
                 rng: np.random.Generator) -> np.ndarray | None:
    found = _constant_weight(node, inits)
    if found is None:
        return None
    shape, dtype = found
    if len(shape) >= 2:
        fan_in = max(int(np.prod(shape[1:])), 1)
        scale = np.float32(np.sqrt(1.0 / fan_in))
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(dtype, copy=False)
    return (rng.random(shape, dtype=np.float32) + np.float32(0.5)).astype(dtype, copy=False)


def _drop_unused(model: onnx.ModelProto) -> None:
    """Remove initializers (and their graph-input entries) that nothing reads any more."""
    graph = model.graph
    used = {name for node in graph.node for name in node.input}
    used |= {name for node in graph.node for attr in node.attribute if attr.g.name
             for sub in [attr.g] for n in sub.node for name in n.input}
    used |= {o.name for o in graph.output}
    dead = {t.name for t in graph.initializer if t.name not in used}
    if not dead:
        return
    kept = [t for t in graph.initializer if t.name not in dead]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    inputs = [i for i in graph.input if i.name not in dead]
    del graph.input[:]
    graph.input.extend(inputs)
