"""d500.model.load: valid models load (external data too); each broken one is a one-line error,
shapes that cannot fit included; shapes known only at run time still load."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from d500.builders import build
from d500.errors import ModelError
from d500.model import load


def relu_model(inputs=("x",), nodes=None, opset: int = 17) -> onnx.ModelProto:
    nodes = nodes or [helper.make_node("Relu", list(inputs), ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                         [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def load_error(source) -> str:
    with pytest.raises(ModelError) as err:
        load(source)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_valid_model_loads_checked_and_shape_inferred(tmp_path):
    path = tmp_path / "lenet.onnx"
    onnx.save(build("lenet5", (1, 28, 28)), path)
    model = load(path)
    inferred = {vi.name: [d.dim_value or d.dim_param for d in vi.type.tensor_type.shape.dim]
                for vi in model.graph.value_info}
    assert inferred["pool1"] == ["N", 6, 14, 14]
    assert load(str(path)).graph.node[0].op_type == "Conv"
    assert load(model) is not model  # a ModelProto comes back shape-inferred, as a new proto


def test_external_data_loads_from_another_directory(tmp_path, monkeypatch):
    model = build("mlp", (1, 28, 28), seed=5)
    folder = tmp_path / "saved"
    folder.mkdir()
    onnx.save(model, folder / "mlp.onnx", save_as_external_data=True,
              all_tensors_to_one_file=True, location="mlp.weights", size_threshold=0)
    assert (folder / "mlp.weights").stat().st_size > 4 * 784 * 128
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    loaded = load(os.path.relpath(folder / "mlp.onnx"))
    original = build("mlp", (1, 28, 28), seed=5)  # onnx.save moved `model`'s data out
    for a, b in zip(loaded.graph.initializer, original.graph.initializer):
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(a),
                                      onnx.numpy_helper.to_array(b))
    (folder / "mlp.weights").unlink()
    message = load_error(folder / "mlp.onnx")
    assert "mlp.onnx" in message and "external data" in message


def test_missing_file_and_directory(tmp_path):
    assert load_error(tmp_path / "nope.onnx") == f"{tmp_path / 'nope.onnx'}: no such file"
    assert "directory" in load_error(tmp_path)


@pytest.mark.parametrize("content", [b"", b"hello, I am a text file\n",
                                     np.random.default_rng(0).bytes(4096)],
                         ids=["empty", "text", "random"])
def test_not_onnx(tmp_path, content):
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    message = load_error(path)
    assert message.startswith(str(path)) and "not an ONNX model" in message


def test_every_truncation_is_a_model_error(tmp_path):
    data = build("lenet5", (1, 8, 8)).SerializeToString()
    path = tmp_path / "cut.onnx"
    for cut in range(0, len(data), max(1, len(data) // 300)):
        path.write_bytes(data[:cut])
        assert str(path) in load_error(path)


def test_undefined_input_and_cycle():
    message = load_error(relu_model(inputs=("nope",)))
    assert "'nope'" in message and "no node, graph input or initializer" in message
    cycle = [helper.make_node("Relu", ["b"], ["a"], name="first"),
             helper.make_node("Relu", ["a"], ["b"], name="second"),
             helper.make_node("Add", ["x", "b"], ["y"], name="add")]
    message = load_error(relu_model(nodes=cycle))
    assert "node 'first'" in message and "cycle" in message


def test_opset_newer_than_installed_onnx(tmp_path):
    newest = onnx.defs.onnx_opset_version()
    path = tmp_path / "future.onnx"
    onnx.save(relu_model(opset=newest + 5), path)
    message = load_error(path)
    assert str(path) in message and f"opset {newest + 5}" in message
    assert onnx.__version__ in message


def test_checker_failure_is_one_line():
    model = relu_model()
    model.graph.node[0].op_type = "NoSuchOp"
    message = load_error(model)
    assert "invalid ONNX graph" in message and "NoSuchOp" in message


# -- shapes that cannot fit are an input error; shapes known only at run time still load -----

def shaped_model(nodes, inputs, initializers=(), output_shape=("A", "B")) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "shapes", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                          for n, s in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(output_shape))],
        list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_matmul_that_cannot_fit_names_node_operator_and_shapes(tmp_path):
    model = shaped_model([helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")],
                         [("a", [2, 3]), ("b", [2, 3])])
    path = tmp_path / "bad-matmul.onnx"
    onnx.save(model, path)
    assert load_error(path) == (f"{path}: node 'mm' (MatMul) cannot take input shapes a 2x3, "
                                f"b 2x3: Incompatible dimensions for matrix multiplication")


def test_unnamed_node_deep_in_the_graph_is_found_by_position():
    nodes = [helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Sigmoid", ["r"], ["s"]),
             helper.make_node("Add", ["s", "b"], ["y"])]
    message = load_error(shaped_model(nodes, [("a", [2, 3]), ("b", [4, 3])]))
    assert "node #2 (Add, no name)" in message and "s 2x3, b 4x3" in message


def test_reshape_and_conv_misfits_onnx_inference_lets_through():
    reshape = shaped_model([helper.make_node("Reshape", ["a", "shape"], ["y"], name="rs")],
                           [("a", [2, 3])], [helper.make_tensor("shape", TensorProto.INT64,
                                                                [2], [4, 4])])
    assert "node 'rs' (Reshape) cannot reshape input a 2x3 (6 elements) to 4x4" in load_error(
        reshape)
    conv = shaped_model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv1")],
                        [("x", [1, 3, 8, 8])],
                        [helper.make_tensor("w", TensorProto.FLOAT, [4, 2, 3, 3], [0.0] * 72)],
                        output_shape=("N", "C", "H", "W"))
    message = load_error(conv)
    assert "node 'conv1' (Conv)" in message and "x 1x3x8x8, w 4x2x3x3" in message
    assert "3 channels" in message


def test_shapes_known_only_at_run_time_still_load():
    # a batch dimension left open, and a Reshape whose target is computed from the input
    nodes = [helper.make_node("MatMul", ["a", "b"], ["m"], name="mm"),
             helper.make_node("Shape", ["a"], ["shape"]),
             helper.make_node("Reshape", ["m", "shape"], ["y"], name="back")]
    model = shaped_model(nodes, [("a", ["N", "K"]), ("b", ["K", "K"])])
    loaded = load(model)
    assert [n.op_type for n in loaded.graph.node] == ["MatMul", "Shape", "Reshape"]
    from onnx.reference import ReferenceEvaluator
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    (y,) = ReferenceEvaluator(loaded).run(None, {"a": a, "b": np.eye(3, dtype=np.float32)})
    np.testing.assert_array_equal(y, a)
    # -1 in a Reshape target fits any batch; so does a Conv whose channels match its weights
    flat = shaped_model([helper.make_node("Reshape", ["a", "shape"], ["y"])], [("a", [2, 3])],
                        [helper.make_tensor("shape", TensorProto.INT64, [2], [-1, 2])])
    assert load(flat).graph.node[0].op_type == "Reshape"


def test_every_official_node_test_and_light_model_still_loads():
    import warnings
    from pathlib import Path

    import onnx.backend.test
    from onnx.backend.test.loader import load_model_tests
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tests = load_model_tests(kind="node")
    assert len(tests) > 1800
    for test in tests:  # test_mvn trips onnx's strict mode inside its function body
        load(test.model)
    light = sorted((Path(onnx.backend.test.__file__).parent / "data" / "light").glob("*.onnx"))
    assert len(light) == 9
    for path in light:
        load(path)


def test_strict_inference_complaints_that_are_not_shapes_are_left_to_the_backends():
    # onnx's inference wants 3 outputs from BatchNormalization in training mode; backends run it
    # with one (d500's gradient checks do), so it is no input error
    graph = helper.make_graph(
        [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"],
                          training_mode=1)], "bn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, 2, 3])]
        + [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in "sbmv"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4, 2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    with pytest.raises(onnx.shape_inference.InferenceError):
        onnx.shape_inference.infer_shapes(model, strict_mode=True)
    assert load(model).graph.node[0].op_type == "BatchNormalization"
