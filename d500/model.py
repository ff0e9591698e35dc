"""Load and check ONNX models (file or ModelProto); the network builders are in d500.builders."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import onnx.checker
import onnx.defs
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
            raise ModelError(f"{path}: no such file")
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
        try:
            model = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False,
                                                      data_prop=True)
        except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as err:
            raise ModelError(f"{where}: shape inference failed: {_one_line(err)}") from None
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
