"""The graph walker shared by translating backends: nodes in order, dispatched to an op table.

An op table maps an ONNX op type (default domain; "domain::Type" in another) to a function
`fn(node, *inputs)` that takes framework tensors (None for a missing optional input) and returns
one tensor or a tuple. Every op module fills its table the same way, with `registry()`:

    OPS, op = registry()            # registry("ai.onnx.ml") for another domain

    @op
    def Relu(node, x): ...          # one ONNX operator = one small function named after it

`node.attrs` holds the attributes as Python values (tensors as NumPy arrays, graphs as
`Program`s ready to run), `node.opset` the opset of the node's domain. Operators the table lacks
but whose ONNX schema defines them as a function of other operators (Celu, LayerNormalization,
Range, ...) are expanded into those operators when the model is prepared.
"""

from __future__ import annotations

import itertools
from collections import ChainMap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import onnx
import onnx.defs
from onnx import AttributeProto, helper, numpy_helper

from d500.errors import UnsupportedOperator

OpTable = Mapping[str, Callable[..., Any]]
_fresh = itertools.count()


def registry(domain: str = "") -> tuple[dict[str, Any], Callable[..., Any]]:
    """A fresh op table and the decorator that adds a function (or class) to it by name.

    `@op` registers `fn` under `fn.__name__`; `@op(names=("Reshape", "Flatten"))` one function
    under several operators; `op(make(...), names=("Sin",))` a function a factory made. In a
    non-default `domain` the keys are "domain::Name", as `Program` looks them up.
    """
    table: dict[str, Any] = {}
    prefix = f"{domain}::" if domain else ""

    def op(fn: Any = None, *, names: tuple[str, ...] = ()) -> Any:
        def add(f: Any) -> Any:
            for name in names or (f.__name__,):
                if prefix + name in table:
                    raise ValueError(f"operator {prefix + name} registered twice")
                table[prefix + name] = f
            return f
        return add(fn) if fn is not None else add

    return table, op


@dataclass
class Node:
    """One node as an op function sees it."""

    op_type: str
    domain: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any]
    opset: int
    proto: onnx.NodeProto
    backend: str
    program: Program | None = field(default=None, repr=False)

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def run_subgraph(self, attr: str, *values: Any) -> list[Any]:
        """Run the graph attribute `attr` with `values` bound to its inputs (outer names seen)."""
        sub: Program = self.attrs[attr]
        assert self.program is not None
        return sub.run(dict(zip(sub.input_names, values)), outer=self.program.scope)

    def unsupported(self, why: str) -> UnsupportedOperator:
        """The error for an attribute/dtype combination this backend cannot compute."""
        return UnsupportedOperator(self.op_type, self.domain, self.opset, self.name,
                                   self.backend, why)


def elem_type(node: Node, name: str) -> int:
    """The ONNX element type of value `name` as the graph records it (0 if unknown)."""
    t = node.program.types.get(name) if node.program is not None else None
    if t is None or t.WhichOneof("value") != "tensor_type":
        return 0
    return t.tensor_type.elem_type


def out_type(node: Node, i: int = 0) -> int:
    """The ONNX element type of the node's output `i` (0 if unknown or absent)."""
    return elem_type(node, node.outputs[i]) if i < len(node.outputs) else 0


def in_type(node: Node, i: int = 0) -> int:
    """The ONNX element type of the node's input `i` (0 if unknown, absent or omitted)."""
    return elem_type(node, node.inputs[i]) if i < len(node.inputs) and node.inputs[i] else 0


def attribute_value(attr: AttributeProto) -> Any:
    """An attribute as a Python value; TENSOR as NumPy, GRAPH left as GraphProto."""
    if attr.type == AttributeProto.TENSOR:
        return numpy_helper.to_array(attr.t)
    if attr.type == AttributeProto.TENSORS:
        return [numpy_helper.to_array(t) for t in attr.tensors]
    if attr.type == AttributeProto.SPARSE_TENSOR:
        return attr.sparse_tensor
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode() for v in value]
    return value


class Program:
    """A GraphProto prepared against one op table; `run(feeds)` returns the graph outputs."""

    def __init__(self, graph: onnx.GraphProto, opsets: Mapping[str, int], ops: OpTable,
                 backend: str, types: Mapping[str, onnx.TypeProto] | None = None,
                 functions: Mapping[tuple[str, str], onnx.FunctionProto] | None = None):
        self.graph = graph
        self.opsets = dict(opsets)
        self.ops = ops
        self.backend = backend
        self.functions = dict(functions or {})
        self.types = dict(types or {})
        for vi in itertools.chain(graph.input, graph.value_info, graph.output):
            if vi.type.WhichOneof("value") is not None:
                self.types.setdefault(vi.name, vi.type)
        for t in graph.initializer:
            self.types.setdefault(t.name, helper.make_tensor_type_proto(t.data_type, t.dims))
        self.input_names = [i.name for i in graph.input]
        self.output_names = [o.name for o in graph.output]
        self.initializers = {t.name: t for t in graph.initializer}
        self.steps: list[tuple[Node, Callable[..., Any]]] = []
        self.scope: Mapping[str, Any] = {}
        for proto in graph.node:
            self._add(proto, self.opsets)

    # -- preparation ----------------------------------------------------------
    def _add(self, proto: onnx.NodeProto, opsets: Mapping[str, int]) -> None:
        domain = "" if proto.domain in ("", "ai.onnx") else proto.domain
        opset = opsets.get(domain, opsets.get("ai.onnx", 1) if domain == "" else 1)
        fn = self.ops.get(proto.op_type) if domain == "" else self.ops.get(
            f"{domain}::{proto.op_type}")
        if fn is None:
            body = self._function_body(proto, domain, opset, opsets)
            if body is None:
                raise UnsupportedOperator(proto.op_type, domain, opset, proto.name, self.backend)
            inner_opsets = dict(opsets)
            inner_opsets.update({o.domain: o.version for o in body.opset_import})
            for inner in _inline(proto, body):
                self._add(inner, inner_opsets)
            return
        attrs = {}
        for a in proto.attribute:
            value = attribute_value(a)
            if isinstance(value, onnx.GraphProto):
                value = Program(value, opsets, self.ops, self.backend, self.types, self.functions)
            elif isinstance(value, list) and value and isinstance(value[0], onnx.GraphProto):
                value = [Program(g, opsets, self.ops, self.backend, self.types, self.functions)
                         for g in value]
            attrs[a.name] = value
        node = Node(proto.op_type, domain, proto.name, list(proto.input), list(proto.output),
                    attrs, opset, proto, self.backend, self)
        self.steps.append((node, fn))

    def _function_body(self, proto: onnx.NodeProto, domain: str, opset: int,
                       opsets: Mapping[str, int]) -> onnx.FunctionProto | None:
        """The function an operator is defined by: a model-local function or the ONNX schema's."""
        local = self.functions.get((proto.domain, proto.op_type))
        if local is not None:
            return local
        try:
            schema = onnx.defs.get_schema(proto.op_type, opset, domain)
        except onnx.defs.SchemaError:
            return None
        if schema.has_function:
            body = schema.get_function_with_opset_version(
                _body_version(schema.function_opset_versions, opset)) if hasattr(
                schema, "get_function_with_opset_version") else schema.function_body
            if isinstance(body, bytes):  # onnx >= 1.16 returns it serialized
                body = onnx.FunctionProto.FromString(body)
            if body is not None and body.node:
                return _with_defaults(_with_opset(body, domain, opset), schema)
        if schema.has_context_dependent_function:
            types = []
            for name in proto.input:
                t = self.types.get(name) if name else None
                if name and t is None:
                    return None
                types.append((t or onnx.TypeProto()).SerializeToString())
            try:
                raw = schema.get_context_dependent_function_with_opset_version(
                    _body_version(schema.context_dependent_function_opset_versions, opset),
                    proto.SerializeToString(), types)
            except Exception:  # noqa: BLE001 - ONNX refuses: the op is simply unsupported
                return None
            if raw:
                body = onnx.FunctionProto()
                body.ParseFromString(raw)
                return _with_defaults(_with_opset(body, domain, opset), schema)
        return None

    # -- execution ------------------------------------------------------------
    def run(self, feeds: Mapping[str, Any], outer: Mapping[str, Any] | None = None) -> list[Any]:
        env: ChainMap[str, Any] = ChainMap(dict(feeds), outer if outer is not None else {})
        saved, self.scope = self.scope, env
        try:
            for node, fn in self.steps:
                args = [env[n] if n else None for n in node.inputs]
                out = fn(node, *args)
                if not isinstance(out, tuple):
                    out = (out,)
                for name, value in zip(node.outputs, out):
                    if name:
                        env[name] = value
            return [env[name] for name in self.output_names]
        finally:
            self.scope = saved


def _body_version(versions: list[int], opset: int) -> int:
    """The function body in force at `opset`: the newest one defined at or before it."""
    return max((v for v in versions if v <= opset), default=opset)


def _with_opset(body: onnx.FunctionProto, domain: str, opset: int) -> onnx.FunctionProto:
    if not any(o.domain == domain for o in body.opset_import):
        body.opset_import.append(helper.make_opsetid(domain, opset))
    return body


def _with_defaults(body: onnx.FunctionProto, schema: onnx.defs.OpSchema) -> onnx.FunctionProto:
    """Give the body the schema's attribute defaults, so references to omitted ones resolve."""
    present = {a.name for a in body.attribute_proto}
    for name, attr in schema.attributes.items():
        if name not in present and attr.default_value.type:
            default = AttributeProto()
            default.CopyFrom(attr.default_value)
            default.name = name
            body.attribute_proto.append(default)
    return body


def _rename_outer(graph: onnx.GraphProto, names: Mapping[str, str]) -> None:
    """Rename, inside a subgraph, the references to values of the enclosing function body."""
    local = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    local |= {o for n in graph.node for o in n.output}
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name and name not in local and name in names:
                node.input[k] = names[name]
        for a in node.attribute:
            for g in [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs):
                _rename_outer(g, names)
    for out in graph.output:
        if out.name not in local and out.name in names:
            out.name = names[out.name]


def _inline(proto: onnx.NodeProto, body: onnx.FunctionProto) -> list[onnx.NodeProto]:
    """The nodes of `body`, formal names bound to the node's, attribute references resolved."""
    prefix = f"__{proto.op_type}_{next(_fresh)}_"
    names = dict(zip(body.input, proto.input))
    names.update(zip(body.output, proto.output))
    for formal in body.input[len(proto.input):]:
        names[formal] = ""
    given = {a.name: a for a in proto.attribute}
    defaults = {a.name: a for a in body.attribute_proto}

    def rename(name: str) -> str:
        if not name:
            return ""
        if name not in names:
            names[name] = prefix + name
        return names[name]

    out = []
    for inner in body.node:
        node = onnx.NodeProto()
        node.CopyFrom(inner)
        del node.input[:]
        node.input.extend(rename(n) for n in inner.input)
        del node.output[:]
        node.output.extend(rename(n) for n in inner.output)
        node.name = prefix + (inner.name or inner.op_type)
        del node.attribute[:]
        for a in inner.attribute:
            if a.ref_attr_name:
                source = given.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
                if source is None:
                    continue
                resolved = AttributeProto()
                resolved.CopyFrom(source)
                resolved.name = a.name
                node.attribute.append(resolved)
            else:
                node.attribute.append(a)
                if a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
                    attr = node.attribute[-1]
                    for g in [attr.g] if a.type == AttributeProto.GRAPH else list(attr.graphs):
                        _rename_outer(g, names)
        out.append(node)
    return out
