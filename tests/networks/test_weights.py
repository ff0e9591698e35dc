"""Random weights for the light models: same architecture, seeded initializers, input-dependent."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from d500.backends import get
from d500.networks import inputs
from d500.networks.check import check
from d500.networks.weights import constant_weights, randomize
from d500.networks.workloads import onnx_package_file


def test_constant_weights_become_seeded_initializers_and_outputs_depend_on_the_input():
    shipped = onnx.load(onnx_package_file("light_squeezenet.onnx"))
    model, count = randomize(shipped, seed=0)
    n_const = sum(n.op_type == "ConstantOfShape" for n in shipped.graph.node)
    assert count == n_const == 39 == constant_weights(shipped)
    assert constant_weights(model) == 0
    assert not any(n.op_type == "ConstantOfShape" for n in model.graph.node)
    assert [n.op_type for n in model.graph.node] == [
        n.op_type for n in shipped.graph.node if n.op_type != "ConstantOfShape"]
    onnx.checker.check_model(model)
    again, _ = randomize(shipped, seed=0)
    other, _ = randomize(shipped, seed=1)
    assert again.SerializeToString() == model.SerializeToString()
    assert other.SerializeToString() != model.SerializeToString()
    exe = get("onnxruntime").prepare(model)
    a = exe.run(inputs.make(model, seed=0))[0]
    b = exe.run(inputs.make(model, seed=1))[0]
    assert np.isfinite(a).all() and np.abs(a - b).max() > 1e-4 * np.abs(a).max()
    shipped_out = get("onnxruntime").prepare(shipped).run(inputs.make(shipped, seed=0))[0]
    assert np.ptp(shipped_out) == 0  # why: shipped, every class gets the same probability


def test_a_model_without_generated_weights_is_unchanged():
    from d500 import builders
    model = builders.build("mlp", (1, 8, 8))
    same, count = randomize(model)
    assert count == 0 and same.SerializeToString() == model.SerializeToString()


@pytest.mark.slow
def test_randomized_resnet50_agrees_on_all_four_backends():
    model, _ = randomize(onnx.load(onnx_package_file("light_resnet50.onnx")), seed=0)
    report = check(model, inputs.make(model, seed=0),
                   ["reference", "torch", "tensorflow", "onnxruntime"])
    assert report.exit_code == 0, report.as_dict()
    worst = max(r.max_rel for r in report.results)
    assert 0 < worst < 1e-4  # real arithmetic differences now, far inside the tolerance


def test_net_check_says_when_constant_weights_make_agreement_meaningless(tmp_path, home):
    from onnx import TensorProto, helper

    from .conftest import d500
    shape = onnx.numpy_helper.from_array(np.array([3, 4], np.int64), "w_shape")
    nodes = [helper.make_node("ConstantOfShape", ["w_shape"], ["w"],
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.5])),
             helper.make_node("MatMul", ["x", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [2, 3])],
                              [helper.make_tensor_value_info("y", 1, [2, 4])], [shape])
    path = tmp_path / "constant.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    plain = d500("net", "check", path, "--backends", "onnxruntime", "--no-record", home=home)
    assert plain.returncode == 0, plain.stderr
    assert "1 weight tensor(s) are one constant" in plain.stdout
    randomized = d500("net", "check", path, "--backends", "onnxruntime", "--no-record",
                      "--random-weights", home=home)
    assert randomized.returncode == 0 and "one constant" not in randomized.stdout
