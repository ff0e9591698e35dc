"""The judge: a one-node ONNX model of an operator, its inferred outputs, its reference forward
(onnx.reference.ReferenceEvaluator with the reference backend's op fixes) and the reference
backend's own gradient."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.defs
import onnx.shape_inference
from onnx import helper

from d500.errors import UsageError

# The opset of a case that names none: a released one every backend supports (the newest the
# installed onnx knows may still be under development and refused by onnxruntime).
DEFAULT_OPSET = min(21, onnx.defs.onnx_opset_version())


def schema(op_type: str, opset: int | None = None) -> onnx.defs.OpSchema:
    try:
        return onnx.defs.get_schema(op_type, opset or DEFAULT_OPSET, "")
    except onnx.defs.SchemaError:
        raise UsageError(f"'{op_type}' is not an ONNX operator (opset {opset})") from None


def _names(formals: Sequence[Any], n: int, prefix: str) -> list[str]:
    names = []
    for i in range(n):
        formal = formals[min(i, len(formals) - 1)] if formals else None
        base = formal.name if formal is not None else f"{prefix}{i}"
        variadic = (formal is not None and
                    formal.option == onnx.defs.OpSchema.FormalParameterOption.Variadic)
        names.append(f"{base}_{i}" if variadic or base in names else base)
    return names


def input_names(op_type: str, n: int, opset: int | None = None) -> list[str]:
    return _names(schema(op_type, opset).inputs, n, "input")


def output_names(op_type: str, n: int, opset: int | None = None) -> list[str]:
    return _names(schema(op_type, opset).outputs, n, "output")


def check_arity(op_type: str, n_inputs: int, opset: int | None = None) -> None:
    s = schema(op_type, opset)
    if not s.min_input <= n_inputs <= s.max_input:
        most = "any number of" if s.max_input > 1000 else f"at most {s.max_input}"
        takes = (f"exactly {s.min_input}" if s.min_input == s.max_input else
                 f"at least {s.min_input} and {most}")
        raise UsageError(f"{op_type} takes {takes} input(s); {n_inputs} input shape(s) given "
                         f"(one --input-shape per input)")


def node_model(op_type: str, attributes: Mapping[str, Any], inputs: Sequence[np.ndarray],
               n_outputs: int = 1, opset: int | None = None) -> onnx.ModelProto:
    """A one-node model of `op_type` whose inputs have the dtypes and shapes of `inputs`."""
    check_arity(op_type, len(inputs), opset)
    known = schema(op_type, opset).attributes
    unknown = [name for name in attributes if name not in known]
    if unknown:
        raise UsageError(f"{op_type} has no attribute '{unknown[0]}' (opset "
                         f"{opset or DEFAULT_OPSET} defines: {', '.join(sorted(known)) or 'none'})")
    n_outputs = max(1, min(n_outputs, schema(op_type, opset).max_output))
    ins, outs = input_names(op_type, len(inputs), opset), output_names(op_type, n_outputs, opset)
    try:
        node = helper.make_node(op_type, ins, outs, name=op_type, **dict(attributes))
    except (TypeError, ValueError) as err:
        raise UsageError(f"{op_type}: bad attribute value ({err})") from None
    graph = helper.make_graph(
        [node], f"{op_type}_case",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in zip(ins, inputs)],
        [helper.make_empty_tensor_value_info(n) for n in outs])
    opset_ = opset or DEFAULT_OPSET
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset_)],
                             ir_version=min(onnx.IR_VERSION, 10))


def typed_node_model(op_type: str, attributes: Mapping[str, Any], inputs: Sequence[np.ndarray],
                     n_outputs: int = 1, opset: int | None = None) -> onnx.ModelProto:
    """node_model with the outputs' dtypes and shapes filled in by shape inference (what a
    backend's checker wants)."""
    model = node_model(op_type, attributes, inputs, n_outputs, opset)
    outs = infer_outputs(op_type, attributes, inputs, n_outputs, opset)
    del model.graph.output[:]
    model.graph.output.extend(
        helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(dtype), shape)
        for name, (dtype, shape) in zip(output_names(op_type, len(outs), opset), outs))
    return model


def describe(op_type: str, attributes: Mapping[str, Any], shapes: Sequence[Sequence[int]]) -> str:
    dims = ", ".join("x".join(map(str, s)) or "scalar" for s in shapes)
    attrs = ", ".join(f"{k}={v}" for k, v in attributes.items())
    return f"{op_type}({dims}{'; ' + attrs if attrs else ''})"


def infer_outputs(op_type: str, attributes: Mapping[str, Any], inputs: Sequence[np.ndarray],
                  n_outputs: int = 1, opset: int | None = None
                  ) -> list[tuple[np.dtype, tuple[int, ...]]]:
    """Output dtypes and shapes by ONNX shape inference; a misfit is a UsageError naming it."""
    model = node_model(op_type, attributes, inputs, n_outputs, opset)
    where = describe(op_type, attributes, [a.shape for a in inputs])
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, check_type=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as err:
        first = str(err).strip().splitlines()[0]
        raise UsageError(f"{where}: the reference rejects these shapes/attributes: "
                         f"{first}") from None
    result = []
    for value in inferred.graph.output:
        t = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim)
        if not t.HasField("shape") or any(d < 0 for d in dims):
            raise UsageError(f"{where}: cannot infer the shape of output '{value.name}'")
        result.append((helper.tensor_dtype_to_np_dtype(t.elem_type), dims))
    return result


def _judge_ops() -> list[Any]:
    """The op fixes the judge runs with: the reference backend's (ops ReferenceEvaluator lacks
    or gets wrong) and an Erf computed in the input's precision (onnx's rounds to float32,
    which would make finite differences in float64 meaningless)."""
    from math import erf

    from onnx.reference.ops._op import OpRunUnaryNum

    from d500.backends.reference.ops import OPS

    class Erf(OpRunUnaryNum):
        op_domain = ""

        def _run(self, x):  # type: ignore[override]
            x = np.asarray(x)
            return (np.vectorize(erf, otypes=[np.float64])(x).astype(x.dtype),)

    return [*(v for k, v in OPS.items() if k != "Erf"), Erf]


class Reference:
    """The reference forward of one operator case, prepared once for given input dtypes/shapes."""

    def __init__(self, op_type: str, attributes: Mapping[str, Any],
                 inputs: Sequence[np.ndarray], n_outputs: int = 1, opset: int | None = None):
        from onnx.reference import ReferenceEvaluator
        self.model = node_model(op_type, attributes, inputs, n_outputs, opset)
        self.names = [i.name for i in self.model.graph.input]
        self.where = describe(op_type, attributes, [a.shape for a in inputs])
        try:
            self.evaluator = ReferenceEvaluator(self.model, new_ops=_judge_ops())
        except Exception as err:  # noqa: BLE001 - the reference refusing the case is bad input
            raise UsageError(f"{self.where}: the reference cannot build this case: {err}") from None

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        with np.errstate(all="ignore"):
            try:
                out = self.evaluator.run(None, dict(zip(self.names, inputs)))
            except Exception as err:  # noqa: BLE001
                first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise UsageError(f"{self.where}: the reference fails on this case: "
                                 f"{first}") from None
        return [np.asarray(o) for o in out]


def reference_gradients(op_type: str, attributes: Mapping[str, Any],
                        inputs: Sequence[np.ndarray], grad_outputs: Sequence[np.ndarray | None],
                        opset: int | None = None) -> list[np.ndarray | None]:
    """The reference backend's own gradient (its NumPy VJP) of one node with respect to each
    float input, for the given output gradients (None where an output gets none); raises a
    D500Error (UnsupportedOperator) when the reference has no backward for the operator."""
    from d500 import backends
    from d500.operators.dtypes import is_float
    model = typed_node_model(op_type, attributes, inputs, len(grad_outputs), opset)
    exe = backends.get("reference").prepare(model)
    names = input_names(op_type, len(inputs), opset)
    outs = output_names(op_type, len(grad_outputs), opset)
    seeds = {outs[k]: g for k, g in enumerate(grad_outputs) if g is not None}
    wrt = [n for n, x in zip(names, inputs) if is_float(np.asarray(x).dtype)]
    with np.errstate(all="ignore"):
        _, grads = exe.gradients(list(inputs), grad_outputs=seeds, wrt=wrt)
    return [grads.get(n) for n in names]
