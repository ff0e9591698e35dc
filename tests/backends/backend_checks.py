"""Checks run on the backend class they are given: what every translating backend passes (the
small CNN's forward pass as ONNX's reference evaluator computes it, shape inputs baked per
value, unsigned arithmetic and output dtypes, sequences as Python lists), and
what every backend passes (an operator it lacks named in full), and what an inference-only one
refuses."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper

from d500.errors import UnsupportedOperator, UsageError
from tests.helpers import custom_op_model


def forward_matches_reference(rep: Any, x: np.ndarray) -> np.ndarray:
    """`rep` (the small CNN, prepared) on `x`: float64 of shape (2, 3), the reference
    evaluator's output within 1e-10; that output, for the caller's native comparison."""
    from onnx.reference import ReferenceEvaluator
    (y,) = rep.run([x])
    assert y.dtype == np.float64 and y.shape == (2, 3)
    expected = ReferenceEvaluator(rep.model).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, expected, rtol=1e-10, atol=1e-12)
    return y


def shape_inputs_are_baked_per_value(backend: Any) -> Any:
    """A Reshape whose shape is an input gives each shape's result; the prepared model back."""
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    graph = helper.make_graph(
        [node], "reshape", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4]),
                            helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])])
    rep = backend.prepare(helper.make_model(graph))
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    for shape in ([6, 4], [4, -1], [0, 12]):
        (y,) = rep.run([x, np.array(shape, np.int64)])
        np.testing.assert_array_equal(y, x.reshape([2 if s == 0 else s for s in shape]))
    return rep


def unsigned_arithmetic_and_output_dtypes(backend: Any) -> None:
    nodes = [helper.make_node("Abs", ["a"], ["abs"]), helper.make_node("Sub", ["a", "b"], ["d"]),
             helper.make_node("ReduceSum", ["a"], ["s"], keepdims=0),
             helper.make_node("MatMul", ["a", "b"], ["m"])]
    graph = helper.make_graph(
        nodes, "u32", [helper.make_tensor_value_info(n, TensorProto.UINT32, [2, 2])
                       for n in "ab"],
        [helper.make_tensor_value_info("abs", TensorProto.UINT32, [2, 2]),
         helper.make_tensor_value_info("d", TensorProto.UINT32, [2, 2]),
         helper.make_tensor_value_info("s", TensorProto.UINT32, []),
         helper.make_tensor_value_info("m", TensorProto.UINT32, [2, 2])])
    rep = backend.prepare(helper.make_model(graph))
    a = np.array([[5, 7], [9, 4_000_000_000]], np.uint32)
    b = np.array([[1, 2], [3, 4]], np.uint32)
    out = rep.run([a, b])
    for got, want in zip(out, [a, a - b, np.sum(a, dtype=np.uint32), a @ b]):
        assert got.dtype == np.uint32
        np.testing.assert_array_equal(got, want)


def sequences_are_python_lists(backend: Any) -> None:
    nodes = [helper.make_node("SplitToSequence", ["x"], ["seq"], axis=0, keepdims=0),
             helper.make_node("SequenceLength", ["seq"], ["n"]),
             helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=1, new_axis=1)]
    graph = helper.make_graph(
        nodes, "seq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2])],
        [helper.make_tensor_value_info("n", TensorProto.INT64, []),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, [2])])
    rep = backend.prepare(helper.make_model(graph))
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    n, y, seq = rep.run([x])
    assert int(n) == 3
    np.testing.assert_array_equal(y, x.T)
    assert isinstance(seq, list) and [s.tolist() for s in seq] == x.tolist()


def unsupported_operator_names_everything(backend: Any, ir_version: int | None = None) -> None:
    """Preparing a model of an operator no backend has fails naming it, its domain and opset,
    the node and the backend, on one line (`ir_version`: as tests.helpers.custom_op_model)."""
    with pytest.raises(UnsupportedOperator) as err:
        backend.prepare(custom_op_model(ir_version))
    e = err.value
    assert (e.op_type, e.domain, e.opset, e.node, e.backend) == (
        "FancyGelu", "com.example", 3, "act1", backend.name)
    message = str(e)
    for part in ("com.example::FancyGelu", "opset 3", "'act1'", f"'{backend.name}'"):
        assert part in message, message
    assert "\n" not in message


def inference_only(backend: Any, rep: Any, model: Any) -> None:
    """`rep`, `model` (d500's digits MLP with its loss) prepared on an inference-only `backend`:
    its parameters are the model's initializers; gradients and new parameters are refused,
    naming the backend and where to train instead."""
    assert backend.trainable is False
    assert sorted(rep.parameters()) == sorted(t.name for t in model.graph.initializer)
    x, labels = np.zeros((2, 1, 8, 8), np.float32), np.array([1, 2])
    for call in (lambda: rep.gradients([x, labels], output="loss"),
                 lambda: rep.set_parameters({"fc1.bias": np.zeros(128)})):
        with pytest.raises(UsageError) as err:
            call()
        for part in ("inference-only", f"'{backend.name}'", "reference"):
            assert part in str(err.value), err.value
