"""The onnxruntime peer: the ONNX node suite, newer-than-known models, and no training hooks."""

from __future__ import annotations

import backend_checks
import numpy as np
import onnx
from onnx import TensorProto, helper

from d500.backends.onnxruntime import OnnxRuntimeBackend, lowest_opset
from d500.builders import build


def relu_model(opset: int, ir: int | None = None) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    if ir is not None:
        model.ir_version = ir
    return model


def test_newest_ir_and_opset_run_when_their_operators_are_old():
    import onnxruntime
    newest = onnx.defs.onnx_opset_version()
    model = relu_model(newest)  # helper.make_model: onnx's newest IR version
    assert lowest_opset(model) == 14  # Relu last changed in opset 14
    out = OnnxRuntimeBackend.prepare(model).run([np.array([-1.0, 0.5, 2.0], np.float32)])
    np.testing.assert_array_equal(out[0], [0, 0.5, 2])
    assert onnxruntime.__version__  # the peer really ran


def test_inference_only():
    model = build("mlp", "digits", loss=True)
    backend_checks.inference_only(OnnxRuntimeBackend, OnnxRuntimeBackend.prepare(model), model)


def test_custom_domain_operator_names_everything():
    backend_checks.unsupported_operator_names_everything(OnnxRuntimeBackend, ir_version=8)
