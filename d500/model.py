"""Load and check ONNX models (file or ModelProto): the checker, and shape inference strict enough
that shapes which cannot fit are an input error; the network builders are in d500.builders."""

from __future__ import annotations

import os
import re
from pathlib import Path

import onnx
import onnx.checker
import onnx.defs
import onnx.numpy_helper
import onnx.shape_inference
from google.protobuf.message import DecodeError

from d500.errors import ModelError


def load(source: onnx.ModelProto | str | os.PathLike, *, check: bool = True,
         infer_shapes: bool = True) -> onnx.ModelProto:
    """An ONNX model, checked and shape-inferred; every failure is a ModelError naming the file."""
    if isinstance(source, onnx.ModelProto):
        model, where = source, f"model '{source.graph.name or '<unnamed>'}'"
    else:
        path = Path(source)
        where = str(path)
        if not path.exists():
            from d500.paths import looked_in
            raise ModelError(f"{path}: no such file{looked_in(path)}")
        if path.is_dir():
            raise ModelError(f"{path}: is a directory, not an ONNX file")
        try:
            model = onnx.load(str(path), load_external_data=True)
        except DecodeError as err:
            raise ModelError(f"{path}: not an ONNX model or truncated ({err})") from None
        except onnx.checker.ValidationError as err:  # external data missing or outside the dir
            raise ModelError(f"{path}: cannot read its external data: {_one_line(err)}") from None
        except (OSError, ValueError) as err:
            raise ModelError(f"{path}: cannot read ONNX model ({_one_line(err)})") from None
        if not model.graph.node and not model.graph.output:
            raise ModelError(f"{path}: not an ONNX model (no graph found)")
    _check_opsets(model, where)
    if check:
        _check_topology(model, where)
        try:
            onnx.checker.check_model(model, full_check=False)
        except onnx.checker.ValidationError as err:
            raise ModelError(f"{where}: invalid ONNX graph: {_one_line(err)}") from None
    if infer_shapes:
        model = _infer_shapes(model, where)
    return model


def _one_line(err: Exception, limit: int = 300) -> str:
    """An exception's message on one line (checker messages span several), shortened."""
    text = " ".join(str(err).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _check_opsets(model: onnx.ModelProto, where: str) -> None:
    newest = onnx.defs.onnx_opset_version()
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx") and imp.version > newest:
            raise ModelError(f"{where}: opset {imp.version} is newer than the installed onnx "
                             f"{onnx.__version__} knows (up to {newest})")


def _check_topology(model: onnx.ModelProto, where: str) -> None:
    """Every node input is defined before use (catches cycles and undefined names)."""
    graph = model.graph
    known = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    known |= {t.values.name for t in graph.sparse_initializer}
    produced = {name for node in graph.node for name in node.output}
    for node in graph.node:
        for name in node.input:
            if name not in known:
                why = ("which only a later node computes (a cycle, or nodes out of order)"
                       if name in produced else
                       "which no node, graph input or initializer defines")
                label = (f"node '{node.name}' ({node.op_type})" if node.name
                         else f"a {node.op_type} node")
                raise ModelError(f"{where}: {label} reads '{name}', {why}")
        known.update(node.output)
    for out in graph.output:
        if out.name not in known:
            raise ModelError(f"{where}: graph output '{out.name}' is never computed")


def _infer_shapes(model: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """The model with inferred shapes; a node whose input shapes cannot fit is a ModelError naming
    the node, its operator and the shapes. Shapes known only at run time (symbolic dimensions,
    shapes computed from inputs) are left open and load."""
    try:
        return _checked(onnx.shape_inference.infer_shapes(
            model, check_type=False, strict_mode=True, data_prop=True), where)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        pass  # find the node whose own shapes do not fit, if any
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False,
                                                     data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as err:
        raise ModelError(f"{where}: shape inference failed: {_one_line(err)}") from None
    culprit = _misfit_node(inferred)
    if culprit is not None:
        raise ModelError(f"{where}: {culprit}")
    # No node of the graph itself is at fault: onnx's strict mode also trips over some function
    # bodies it expands (MeanVarianceNormalization's in onnx 1.23), which are not the model's.
    return _checked(inferred, where)


def _checked(model: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """Shape checks onnx's inference leaves out (Reshape sizes, Conv channels)."""
    found = _misfit_extra(model)
    if found is not None:
        raise ModelError(f"{where}: {found}")
    return model


def _types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    graph = model.graph
    types = {vi.name: vi.type for vi in (*graph.input, *graph.value_info, *graph.output)}
    for init in graph.initializer:
        types.setdefault(init.name, onnx.helper.make_tensor_type_proto(init.data_type,
                                                                         list(init.dims)))
    return types


def _constants(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    """Tensors whose values the graph fixes: initializers and Constant nodes' `value`."""
    data = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for attr in node.attribute:
                if attr.name == "value":
                    data[node.output[0]] = attr.t
    return data


def _dims(tensor_type: onnx.TypeProto | None) -> list[int | str] | None:
    """A tensor's dimensions (ints, or names for open ones); None when the rank is unknown."""
    if tensor_type is None or not tensor_type.HasField("tensor_type") or not (
            tensor_type.tensor_type.HasField("shape")):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
            for d in tensor_type.tensor_type.shape.dim]


def _shape_text(dims: list[int | str] | None) -> str:
    if dims is None:
        return "unknown shape"
    return "x".join(map(str, dims)) if dims else "scalar"


def _label(node: onnx.NodeProto, index: int) -> str:
    if node.name:
        return f"node '{node.name}' ({node.op_type})"
    return f"node #{index} ({node.op_type}, no name)"


def _inputs_text(node: onnx.NodeProto, types: dict[str, onnx.TypeProto]) -> str:
    return ", ".join(f"{name} {_shape_text(_dims(types.get(name)))}"
                     for name in node.input if name)


def _opset(model: onnx.ModelProto, domain: str) -> int:
    domain = "" if domain == "ai.onnx" else domain
    return next((o.version for o in model.opset_import if o.domain == domain), 0)


# What onnx's shape inference says when shapes do not fit (a dimension, rank, axis or broadcast).
# Its other complaints (e.g. that BatchNormalization in training mode "should" have 3 outputs) are
# left to the backends, which may well run the model, as they were before strict inference.
SHAPE_WORDS = re.compile(r"dimension|shape|rank|broadcast|axis|axes|size|incompatible|mismatch"
                         r"|match|length|out of range", re.IGNORECASE)


def _misfit_node(model: onnx.ModelProto) -> str | None:
    """The first top-level node whose own shape inference rejects its input shapes, as a
    message naming the node, the operator, the shapes and onnx's reason; None if none does."""
    types, data = _types(model), _constants(model)
    for index, node in enumerate(model.graph.node):
        try:
            schema = onnx.defs.get_schema(node.op_type, _opset(model, node.domain), node.domain)
        except onnx.defs.SchemaError:
            continue  # a custom operator: its backend is the judge
        if not schema.has_type_and_shape_inference_function:
            continue
        try:
            onnx.shape_inference.infer_node_outputs(
                schema, node, {n: types[n] for n in node.input if n in types},
                {n: data[n] for n in node.input if n in data}, None,
                list(model.opset_import), model.ir_version)
        except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as err:
            reason = re.sub(r"\[\w+\]\s*", "", _one_line(err)).strip()
            if not SHAPE_WORDS.search(reason):
                continue  # a convention of onnx's inference (output arity, ...), not a misfit
            return (f"{_label(node, index)} cannot take input shapes "
                    f"{_inputs_text(node, types)}: {reason}")
    return None


def _misfit_extra(model: onnx.ModelProto) -> str | None:
    """Reshape to a different element count and Conv channels that do not match the weights,
    where every size involved is known (onnx's inference does not check these)."""
    types, data = _types(model), None
    for index, node in enumerate(model.graph.node):
        if node.domain not in ("", "ai.onnx") or node.op_type not in ("Reshape", "Conv"):
            continue
        dims = [_dims(types.get(name)) if name else None for name in node.input]
        if node.op_type == "Conv" and len(dims) >= 2 and dims[0] and dims[1]:
            x, w = dims[0], dims[1]
            group = next((a.i for a in node.attribute if a.name == "group"), 1)
            if len(x) > 1 and len(w) > 1 and all(isinstance(d, int) for d in (x[1], w[1])) \
                    and x[1] != w[1] * group:
                return (f"{_label(node, index)} cannot take input shapes "
                        f"{_inputs_text(node, types)}: the input has {x[1]} channels, the "
                        f"weights take {w[1]} per group x {group} group(s) = {w[1] * group}")
        if node.op_type == "Reshape" and len(node.input) == 2 and dims[0] is not None \
                and all(isinstance(d, int) for d in dims[0]):
            data = _constants(model) if data is None else data
            if node.input[1] not in data:
                continue
            target = [int(v) for v in onnx.numpy_helper.to_array(data[node.input[1]]).ravel()]
            allowzero = next((a.i for a in node.attribute if a.name == "allowzero"), 0)
            wanted = [dims[0][i] if v == 0 and not allowzero and i < len(dims[0]) else v
                      for i, v in enumerate(target)]
            size = _product(dims[0])
            known = _product([v for v in wanted if v != -1])
            fits = (size % known == 0 if known else size == 0) if -1 in wanted \
                else size == known
            if not fits:
                return (f"{_label(node, index)} cannot reshape input {node.input[0]} "
                        f"{_shape_text(dims[0])} ({size} elements) to "
                        f"{_shape_text(target)}")
    return None


def _product(values: list) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out
