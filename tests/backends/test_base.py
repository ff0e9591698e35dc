"""The backend contract every trainable backend shares: what gradients() differentiates, how
parameters are set, where a backend's framework comes from, and the one op registry."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from d500 import backends
from d500.backends.base import Backend
from d500.backends.graph import registry
from d500.errors import UsageError

TRAINABLE = backends.trainable()  # every registered framework that trains


def gather_model():
    """y = Gather(Reshape(x @ w, shape), idx): a float input, an int64 input, a float
    parameter and an int64 initializer."""
    w = np.random.default_rng(0).normal(size=(3, 4))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Reshape", ["h", "shape"], ["r"]),
             helper.make_node("Gather", ["r", "idx"], ["y"], axis=0)]
    graph = helper.make_graph(
        nodes, "gather",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [2, 3]),
         helper.make_tensor_value_info("idx", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [2, 2])],
        [numpy_helper.from_array(w, "w"),
         numpy_helper.from_array(np.array([4, 2], dtype=np.int64), "shape")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), w


def feeds():
    x = np.random.default_rng(1).normal(size=(2, 3))
    return {"x": x, "idx": np.array([3, 0], dtype=np.int64)}


@pytest.mark.parametrize("name", TRAINABLE)
def test_default_targets_are_float_parameters_and_float_inputs(name):
    model, w = gather_model()
    rep = backends.get(name).prepare(model)
    assert rep.gradient_targets(feeds()) == ["w", "x"]
    outs, grads = rep.gradients(feeds(), output="y")
    assert sorted(grads) == ["w", "x"]
    # y rows are rows 3 and 0 of (x @ w).reshape(4, 2):
    # row 3 is x[1] @ w[:, 2:], row 0 x[0] @ w[:, :2]
    x = feeds()["x"]
    np.testing.assert_allclose(outs[0], [x[1] @ w[:, 2:], x[0] @ w[:, :2]], rtol=1e-12)
    want_x = np.array([w[:, :2].sum(axis=1), w[:, 2:].sum(axis=1)])
    np.testing.assert_allclose(grads["x"], want_x, rtol=1e-12)
    want_w = np.zeros_like(w)
    want_w[:, :2] += x[0][:, None]
    want_w[:, 2:] += x[1][:, None]
    np.testing.assert_allclose(grads["w"], want_w, rtol=1e-12)


@pytest.mark.parametrize("name", TRAINABLE)
@pytest.mark.parametrize("target, why", [
    ("idx", r"'idx': input of dtype int64, not float"),
    ("shape", r"'shape': an initializer of dtype int64, not a float parameter"),
    ("nosuch", r"'nosuch': not a parameter or input of the model \(inputs: x, idx; 1 param"),
])
def test_a_named_target_that_is_not_float_is_a_usage_error_naming_it(name, target, why):
    rep = backends.get(name).prepare(gather_model()[0])
    with pytest.raises(UsageError, match=why):
        rep.gradients(feeds(), output="y", wrt=["w", target])


@pytest.mark.parametrize("name", TRAINABLE)
def test_an_input_not_given_cannot_be_a_target(name):
    rep = backends.get(name).prepare(gather_model()[0])
    with pytest.raises(UsageError, match="'x': that input was not given"):
        rep.gradient_targets({"idx": feeds()["idx"]}, ["x"])


@pytest.mark.parametrize("name", TRAINABLE)
def test_an_unknown_output_is_a_usage_error_before_anything_runs(name):
    rep = backends.get(name).prepare(gather_model()[0])
    with pytest.raises(UsageError, match=r"'z' is not an output of the model \(outputs: y\)"):
        rep.gradients(feeds(), output="z")
    with pytest.raises(UsageError, match="'z' is not an output"):
        rep.gradients(feeds(), grad_outputs={"z": np.ones((2, 2))})


@pytest.mark.parametrize("name", TRAINABLE)
def test_set_parameters_reshapes_same_size_values_and_refuses_others(name):
    rep = backends.get(name).prepare(gather_model()[0])
    new = np.arange(12.0)
    rep.set_parameters({"w": new})  # same number of elements: reshaped to (3, 4)
    np.testing.assert_array_equal(rep.parameters()["w"], new.reshape(3, 4))
    with pytest.raises(UsageError, match=r"parameter 'w' has shape \(3, 4\), got a value of "
                                         r"shape \(5,\)"):
        rep.set_parameters({"w": np.zeros(5)})
    with pytest.raises(UsageError, match="'shape' is not a parameter of this model "
                                         r"\(parameters: w\)"):
        rep.set_parameters({"shape": np.array([2, 4])})


def test_framework_comes_from_the_one_table():
    for name in backends.BUILTIN:
        assert backends.get(name).framework == backends.framework(name)[1]
    assert backends.get("torch").version().startswith(__import__("torch").__version__[:4])
    assert backends.get("reference").version() == np.__version__


def test_a_third_party_backend_keeps_its_own_framework():
    class Mine(Backend):
        name = "mine"
        framework = "numpy"

    class Unknown(Backend):
        name = "unknown"

    class Shadow(Backend):  # a built-in name, but the class says otherwise: the class wins
        name = "torch"
        framework = "pytest"

    assert Mine.framework == "numpy" and Mine.version() == np.__version__
    assert Unknown.framework == "?" and Unknown.version() == "?"
    assert Shadow.framework == "pytest" and Shadow.version() == pytest.__version__


def test_registry_names_functions_after_themselves_and_refuses_duplicates():
    ops, op = registry("ai.onnx.preview.training")

    @op
    def Adam(node):
        return "adam"

    @op(names=("Reshape", "Flatten"))
    def _reshape(node):
        return "reshape"

    assert sorted(ops) == ["ai.onnx.preview.training::Adam", "ai.onnx.preview.training::Flatten",
                           "ai.onnx.preview.training::Reshape"]
    assert ops["ai.onnx.preview.training::Adam"] is Adam
    with pytest.raises(ValueError, match="registered twice"):
        op(lambda node: None, names=("Adam",))
