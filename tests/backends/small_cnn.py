"""A small float64 CNN in ONNX, shared by the translating backends' tests (gradients vs native)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def small_cnn(seed: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Conv -> BatchNormalization -> Relu -> MaxPool -> Flatten -> Gemm -> Softmax, float64."""
    rng = np.random.default_rng(seed)
    weights = {
        "w": rng.normal(0, 0.5, (4, 2, 3, 3)), "b": rng.normal(0, 0.1, 4),
        "scale": rng.uniform(0.5, 1.5, 4), "shift": rng.normal(0, 0.1, 4),
        "mean": rng.normal(0, 0.1, 4), "var": rng.uniform(0.5, 1.5, 4),
        "fc_w": rng.normal(0, 0.3, (3, 16)), "fc_b": rng.normal(0, 0.1, 3),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["n"],
                         epsilon=1e-5),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["g"], transB=1),
        helper.make_node("Softmax", ["g"], ["y"], axis=1),
    ]
    graph = helper.make_graph(
        nodes, "small_cnn",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [2, 2, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [2, 3])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), weights


def inputs() -> np.ndarray:
    """The batch the tests run the small CNN on: two float64 inputs of 2x8x8."""
    return np.random.default_rng(1).normal(size=(2, 2, 8, 8))
