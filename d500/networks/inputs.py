"""Seeded inputs for a network: graph-input specs, default sizes for open dims, .npz input files.

Default sizes of dimensions the model leaves open (a `dim_param` such as "N", or no size at all):
the leading (batch) axis gets `DEFAULT_BATCH` = 2 (two samples catch a backend that mixes
samples up, e.g. in batch normalisation, which one sample cannot), every other open axis gets
`DEFAULT_DIM` = 32. A named dimension gets one size everywhere it appears. `--dim NAME=SIZE`
(net check) or a workload's `batch_size` (net bench) overrides them.

Values: float inputs are standard normal; integer inputs consumed as class labels by
SoftmaxCrossEntropyLoss / NegativeLogLikelihoodLoss (directly or through a Reshape) are uniform in
[0, classes), those indexing an initializer's rows by Gather (token ids into an embedding) uniform
in [0, rows); other integer inputs are uniform in [0, `INT_HIGH`); booleans are fair coin flips.
All come from `numpy.random.default_rng(seed)`, drawn in graph-input order, so every backend sees
the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from d500.errors import UsageError

DEFAULT_BATCH = 2
DEFAULT_DIM = 32
INT_HIGH = 10
_LABEL_OPS = ("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss")


@dataclass(frozen=True)
class InputSpec:
    """One graph input: its name, NumPy dtype and shape (ints, or str/None for open dims)."""

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...]

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)


def specs(model: onnx.ModelProto) -> list[InputSpec]:
    """The graph inputs that are not initializers, in graph order."""
    inits = {t.name for t in model.graph.initializer}
    out = []
    for value in model.graph.input:
        if value.name in inits:
            continue
        tensor = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            raise UsageError(f"model input '{value.name}' is not a tensor (sequences, maps and "
                             f"optionals are not supported as network inputs)")
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        if not tensor.HasField("shape"):
            raise UsageError(f"model input '{value.name}' has no shape (unknown rank); "
                             f"give its values with --inputs FILE.npz")
        shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                      for d in tensor.shape.dim)
        out.append(InputSpec(value.name, dtype, shape))
    return out


def resolve_shapes(input_specs: list[InputSpec], *, batch: int | None = None,
                   dims: Mapping[str, int] | None = None) -> dict[str, tuple[int, ...]]:
    """Concrete shapes: fixed dims kept, open dims sized by `dims` (by name), `batch` (the
    leading axis) or the documented defaults."""
    dims = dict(dims or {})
    unknown = set(dims) - {d for s in input_specs for d in s.shape if isinstance(d, str)}
    if unknown:
        named = sorted({d for s in input_specs for d in s.shape if isinstance(d, str)})
        raise UsageError(f"no input dimension named {min(unknown)!r} "
                         f"(the model's named dimensions: {', '.join(named) or 'none'})")
    sizes: dict[str, int] = dict(dims)
    shapes = {}
    for spec in input_specs:
        shape = []
        for axis, d in enumerate(spec.shape):
            if isinstance(d, int):
                shape.append(d)
                continue
            if isinstance(d, str) and d in sizes:
                shape.append(sizes[d])
                continue
            size = (batch or DEFAULT_BATCH) if axis == 0 else DEFAULT_DIM
            if isinstance(d, str):
                sizes[d] = size
            shape.append(size)
        shapes[spec.name] = tuple(shape)
    return shapes


def label_classes(model: onnx.ModelProto) -> dict[str, int]:
    """Integer inputs used as class labels by a loss node -> the number of classes (axis 1 of the
    scores), where shape inference knows it."""
    from onnx import shape_inference
    try:
        inferred = shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - best effort: without shapes labels get [0, INT_HIGH)
        inferred = model
    shapes = {}
    for value in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        dims = value.type.tensor_type.shape.dim
        shapes[value.name] = [d.dim_value if d.HasField("dim_value") else None for d in dims]
    reshaped = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Reshape"}
    out = {}
    for node in model.graph.node:
        if node.op_type in _LABEL_OPS and len(node.input) >= 2:
            scores = shapes.get(node.input[0], [])
            if len(scores) >= 2 and scores[1]:  # labels, also as reshaped for the loss
                out[reshaped.get(node.input[1], node.input[1])] = int(scores[1])
    return {**out, **token_ids(model)}


def token_ids(model: onnx.ModelProto) -> dict[str, int]:
    """Integer values that index an initializer's rows by Gather (token ids into an embedding)
    -> the number of rows: what an id may be."""
    rows = {t.name: t.dims[0] for t in model.graph.initializer if t.dims}
    return {node.input[1]: int(rows[node.input[0]]) for node in model.graph.node
            if node.op_type == "Gather" and len(node.input) == 2 and node.input[0] in rows
            and not any(a.name == "axis" and a.i for a in node.attribute)}


def make(model: onnx.ModelProto, seed: int = 0, *, batch: int | None = None,
         dims: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Seeded inputs for every graph input (see the module docstring for the rules)."""
    input_specs = specs(model)
    shapes = resolve_shapes(input_specs, batch=batch, dims=dims)
    classes = label_classes(model)
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in input_specs:
        shape = shapes[spec.name]
        kind = spec.dtype.kind
        if kind == "f":
            value = rng.standard_normal(shape).astype(spec.dtype)
        elif kind in "iu":
            high = classes.get(spec.name, INT_HIGH)
            value = rng.integers(0, high, size=shape).astype(spec.dtype)
        elif kind == "b":
            value = rng.integers(0, 2, size=shape).astype(bool)
        elif kind == "c":
            value = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(
                spec.dtype)
        else:
            raise UsageError(f"model input '{spec.name}' has dtype {spec.dtype}, for which d500 "
                             f"makes no random values; give them with --inputs FILE.npz")
        feeds[spec.name] = value
    return feeds


def load_npz(path: str | Path, model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Inputs from an .npz file keyed by input name, checked against the model's inputs."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{path}: a folder, where an inputs file (.npz) goes")
    if not path.is_file():
        from d500.paths import looked_in
        raise UsageError(f"{path}: no such inputs file{looked_in(path)}")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except Exception as err:  # noqa: BLE001 - zipfile/pickle/value errors all mean "not an npz"
        # NumPy's word for a file that is neither .npz nor .npy is that it may be a pickle and
        # how to load it unsafely: advice d500 never takes
        why = "neither an .npz archive nor an .npy array" if "pickle" in str(err) else err
        raise UsageError(f"{path}: not a NumPy .npz file ({why})") from None
    input_specs = specs(model)
    names = [s.name for s in input_specs]
    unknown = sorted(set(arrays) - set(names))
    if unknown:
        raise UsageError(f"{path}: array '{unknown[0]}' is not a model input "
                         f"(inputs: {', '.join(names)})")
    missing = [n for n in names if n not in arrays]
    if missing:
        raise UsageError(f"{path}: no array for model input '{missing[0]}'")
    for spec in input_specs:
        value = arrays[spec.name]
        if value.dtype != spec.dtype:
            raise UsageError(f"{path}: input '{spec.name}' is {value.dtype}, the model wants "
                             f"{spec.dtype}")
        if value.ndim != len(spec.shape) or any(
                isinstance(d, int) and d != v for d, v in zip(spec.shape, value.shape)):
            want = "x".join(str(d) if d is not None else "?" for d in spec.shape)
            raise UsageError(f"{path}: input '{spec.name}' has shape "
                             f"{'x'.join(map(str, value.shape)) or 'scalar'}, the model wants "
                             f"{want or 'scalar'}")
    return arrays


def parse_dims(items: list[str] | None) -> dict[str, int]:
    """`NAME=SIZE` strings (from --dim) as a mapping."""
    out = {}
    for item in items or []:
        name, sep, size = item.partition("=")
        if not sep or not name or not size.strip().isdigit() or int(size) < 1:
            raise UsageError(f"--dim {item!r}: expected NAME=SIZE with a positive integer size")
        out[name.strip()] = int(size)
    return out
