"""The torch backend's cheaper pass wrapper gives the gradients of the plain formula, bit for bit,
and still checks every input shape."""

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from d500.backends.torch.executable import TorchExecutable
from d500.errors import UsageError


def _model() -> onnx.ModelProto:
    """y = relu(x W + b), loss = sum(y * y): two outputs, one scalar."""
    rng = np.random.default_rng(3)
    inits = [helper.make_tensor("W", TensorProto.FLOAT, [5, 4],
                                rng.standard_normal(20).astype(np.float32)),
             helper.make_tensor("b", TensorProto.FLOAT, [4],
                                rng.standard_normal(4).astype(np.float32))]
    nodes = [helper.make_node("Gemm", ["x", "W", "b"], ["h"]),
             helper.make_node("Relu", ["h"], ["y"]),
             helper.make_node("Mul", ["y", "y"], ["sq"]),
             helper.make_node("ReduceSum", ["sq"], ["loss"], keepdims=0)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4]),
         helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _plain(exe: TorchExecutable, x: np.ndarray, seeds: dict[str, np.ndarray]) -> dict:
    """The gradients by the formula the wrapper used before: d/dθ sum_i (out_i * seed_i).sum()."""
    module = exe.native
    with torch.enable_grad():
        xt = torch.from_numpy(x).requires_grad_(True)
        outs = module(x=xt)
        loss = sum((outs[exe.output_index(n)] * torch.from_numpy(np.asarray(g))).sum()
                   for n, g in seeds.items())
        targets = [module.values["W"], module.values["b"], xt]
        grads = torch.autograd.grad(loss, targets)
    return {n: g.numpy() for n, g in zip(["W", "b", "x"], grads)}


@pytest.mark.parametrize("seeds", [
    {"loss": np.float32(0.37)},                                    # scalar seed, scalar output
    {"loss": np.float32(1.0)},
    {"y": np.random.default_rng(1).standard_normal((6, 4)).astype(np.float32)},  # same shape
    {"y": np.float32(0.5)},                                         # broadcast: the formula
    {"y": np.ones((6, 4), np.float64)},                             # another dtype: the formula
    {"y": np.ones((6, 4), np.float32), "loss": np.float32(0.25)},   # two seeds: the formula
])
def test_gradients_equal_the_formula_bit_for_bit(seeds):
    exe = TorchExecutable(_model())
    x = np.random.default_rng(2).standard_normal((6, 5)).astype(np.float32)
    _, got = exe.gradients({"x": x}, grad_outputs=seeds)
    want = _plain(exe, x, seeds)
    for name in want:
        assert got[name].dtype == want[name].dtype
        assert np.array_equal(got[name], want[name]), name


def test_no_seed_is_the_sum_of_the_output():
    exe = TorchExecutable(_model())
    x = np.random.default_rng(2).standard_normal((3, 5)).astype(np.float32)
    _, got = exe.gradients({"x": x}, output="y")
    want = _plain(exe, x, {"y": np.float32(1.0)})
    assert all(np.array_equal(got[n], want[n]) for n in want)


def test_a_shape_checked_once_does_not_let_another_through():
    exe = TorchExecutable(_model())
    exe.gradients({"x": np.ones((2, 5), np.float32)}, output="loss")
    exe.gradients({"x": np.ones((2, 5), np.float32)}, output="loss")  # remembered
    with pytest.raises(UsageError, match=r"input 'x' has shape \(2, 6\)"):
        exe.gradients({"x": np.ones((2, 6), np.float32)}, output="loss")
    with pytest.raises(UsageError, match=r"input 'x' has shape \(2, 6\)"):
        exe.run({"x": np.ones((2, 6), np.float32)})
