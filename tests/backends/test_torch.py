"""The torch backend: ONNX node suite and light models, gradients, dtypes torch lacks, errors."""

from __future__ import annotations

import backend_checks
import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from small_cnn import inputs, small_cnn

from d500.backends.torch import TorchBackend
from d500.errors import UsageError


# -- a small CNN, in ONNX and natively in torch with the same weights -----------------------------
def native_cnn(x, p):
    import torch.nn.functional as F
    y = F.conv2d(x, p["w"], p["b"], stride=2, padding=1)
    y = (y - p["mean"][:, None, None]) / torch.sqrt(p["var"][:, None, None] + 1e-5)
    y = torch.relu(y * p["scale"][:, None, None] + p["shift"][:, None, None])
    y = F.max_pool2d(y, 2, 2).flatten(1)
    return torch.softmax(F.linear(y, p["fc_w"], p["fc_b"]), dim=1)


def test_outputs_and_gradients_match_native_torch_autograd():
    model, weights = small_cnn()
    x = inputs()
    seed = np.random.default_rng(2).normal(size=(2, 3))
    rep = TorchBackend.prepare(model)
    outs, grads = rep.gradients([x], grad_outputs={"y": seed})
    assert sorted(grads) == sorted([*weights, "x"])

    params = {k: torch.tensor(v, requires_grad=True) for k, v in weights.items()}
    xt = torch.tensor(x, requires_grad=True)
    y = native_cnn(xt, params)
    expected = torch.autograd.grad((y * torch.tensor(seed)).sum(), [*params.values(), xt])
    np.testing.assert_allclose(outs[0], y.detach().numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(rep.run([x])[0], y.detach().numpy(), rtol=1e-12, atol=1e-14)
    for name, g in zip([*params, "x"], expected):
        np.testing.assert_allclose(grads[name], g.numpy(), rtol=1e-9, atol=1e-12,
                                   err_msg=name)


def test_gradients_agree_with_finite_differences():
    model, weights = small_cnn(seed=3)
    x = np.random.default_rng(4).normal(size=(2, 2, 8, 8))
    rng = np.random.default_rng(5)
    seed = rng.normal(size=(2, 3))
    rep = TorchBackend.prepare(model)
    _, grads = rep.gradients({"x": x}, grad_outputs={"y": seed})

    def objective(name: str, value: np.ndarray) -> float:
        if name == "x":
            return float(np.sum(rep.run([value])[0] * seed))
        rep.set_parameters({name: value})
        try:
            return float(np.sum(rep.run([x])[0] * seed))
        finally:
            rep.set_parameters({name: weights[name]})

    h = 1e-6
    for name, base in {**weights, "x": x}.items():
        for _ in range(2):
            step = rng.normal(size=base.shape)
            numeric = (objective(name, base + h * step)
                       - objective(name, base - h * step)) / (2 * h)
            assert float(np.sum(grads[name] * step)) == pytest.approx(numeric, rel=1e-6,
                                                                      abs=1e-9), name


@pytest.mark.parametrize("name,shape", [("mlp", (1, 8, 8)), ("lenet5", (1, 28, 28)),
                                        ("resnet20", (3, 32, 32))])
def test_training_gradients_agree_with_the_reference_backend(name, shape):
    from d500.backends.reference import ReferenceBackend
    from d500.builders import build
    model = build(name, shape, loss=True)
    rng = np.random.default_rng(0)
    feeds = {"input": rng.normal(size=(4, *shape)).astype(np.float32),
             "labels": rng.integers(0, 10, 4)}
    outs, grads = TorchBackend.prepare(model).gradients(feeds, output="loss")
    ref_outs, ref_grads = ReferenceBackend.prepare(model).gradients(feeds, output="loss")
    assert sorted(grads) == sorted(ref_grads)
    np.testing.assert_allclose(outs[1], ref_outs[1], rtol=1e-5)
    for key, expected in ref_grads.items():
        scale = np.abs(expected).max() + 1e-12
        np.testing.assert_allclose(grads[key] / scale, expected / scale, atol=1e-5, err_msg=key)


def test_gradient_of_a_named_output_and_a_subset():
    model, _ = small_cnn()
    x = inputs()
    rep = TorchBackend.prepare(model)
    _, grads = rep.gradients([x], output="y", wrt=["fc_w", "x"])
    assert sorted(grads) == ["fc_w", "x"]
    assert grads["fc_w"].shape == (3, 16) and grads["x"].dtype == np.float64
    # softmax rows sum to one, so d(sum y)/d anything is zero
    assert np.abs(grads["x"]).max() < 1e-12
    with pytest.raises(UsageError, match="nosuch"):
        rep.gradients([x], wrt=["nosuch"])
    with pytest.raises(UsageError, match="not an output"):
        rep.gradients([x], output="c")


def test_parameters_round_trip_and_native_module():
    model, weights = small_cnn()
    rep = TorchBackend.prepare(model)
    assert sorted(rep.parameters()) == sorted(weights)
    np.testing.assert_array_equal(rep.parameters()["w"], weights["w"])
    rep.set_parameters({"fc_b": np.array([10.0, 0.0, 0.0])})
    x = np.zeros((2, 2, 8, 8))
    assert (rep.run({"x": x})[0].argmax(axis=1) == 0).all()
    assert isinstance(rep.native, torch.nn.Module)
    # BatchNormalization's running statistics are buffers, as in torch's own batch norm
    names = {v: k for k, v in rep.native.attr_names.items()}
    assert sorted(names[n] for n, _ in rep.native.named_parameters()) == sorted(
        set(weights) - {"mean", "var"})
    assert {"mean", "var"} <= {names.get(n) for n, _ in rep.native.named_buffers()}
    with pytest.raises(UsageError, match="'nosuch' is not a parameter"):
        rep.set_parameters({"nosuch": np.zeros(1)})
    with pytest.raises(UsageError, match=r"parameter 'fc_b' has shape \(3,\)"):
        rep.set_parameters({"fc_b": np.zeros(4)})


# -- dtypes torch has no CPU kernels for -----------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div", "Max", "Min", "Mod", "Less",
                                     "GreaterOrEqual"])
def test_unsigned_arithmetic_wraps_like_numpy(dtype, op_type):
    top = int(np.iinfo(dtype).max)
    a = np.array([0, 1, 7, top, top - 3, 12345, top // 2 + 9], dtype=dtype)
    b = np.array([1, 2, 3, 5, top, 7, top // 2 - 4], dtype=dtype)
    node = helper.make_node(op_type, ["a", "b"], ["y"])
    out = TorchBackend.run_node(node, [a, b])[0]
    with np.errstate(over="ignore"):
        expected = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply,
                    "Div": np.floor_divide, "Max": np.maximum, "Min": np.minimum,
                    "Mod": np.mod, "Less": np.less, "GreaterOrEqual": np.greater_equal,
                    }[op_type](a, b)
    assert out.dtype == expected.dtype
    np.testing.assert_array_equal(out, expected)


def test_unsigned_cast_reduce_and_shift():
    a = np.array([[1, 2**31], [3, 2**32 - 1]], dtype=np.uint32)
    total = TorchBackend.run_node(helper.make_node("ReduceSum", ["a"], ["y"], axes=[0]), [a],
                                  opset_version=11)[0]
    assert total.dtype == np.uint32 and total.tolist() == [[4, 2**31 - 1]]
    y = TorchBackend.run_node(helper.make_node("BitShift", ["a", "s"], ["y"], direction="LEFT"),
                              [a, np.array([1], dtype=np.uint32)])[0]
    np.testing.assert_array_equal(y, a << np.uint32(1))
    big = np.array([2**64 - 1, 2**63], dtype=np.uint64)
    y = TorchBackend.run_node(helper.make_node("BitShift", ["a", "s"], ["y"], direction="RIGHT"),
                              [big, np.array([4, 63], dtype=np.uint64)])[0]
    assert y.tolist() == [2**60 - 1, 1]
    c = TorchBackend.run_node(helper.make_node("Cast", ["f"], ["y"], to=TensorProto.UINT16),
                              [np.array([1.7, 65535.0, 300.2], dtype=np.float32)])[0]
    assert c.dtype == np.uint16 and c.tolist() == [1, 65535, 300]


# -- errors ----------------------------------------------------------------------------------------
def test_unsupported_operator_names_op_domain_opset_node_and_backend():
    backend_checks.unsupported_operator_names_everything(TorchBackend)


def test_bad_input_shapes_are_one_line_usage_errors():
    model, _ = small_cnn()
    rep = TorchBackend.prepare(model)
    with pytest.raises(UsageError, match=r"input 'x' has shape \(2, 3, 8, 8\); the model declares "
                                         r"\(2, 2, 8, 8\)"):
        rep.run([np.zeros((2, 3, 8, 8))])
    node = helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", "K"])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["K", "M"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "M"])
    rep = TorchBackend.prepare(helper.make_model(helper.make_graph([node], "g", [a, b], [y])))
    with pytest.raises(UsageError, match=r"node 'mm' \(MatMul\) failed"):
        rep.run([np.zeros((2, 3), np.float32), np.zeros((4, 5), np.float32)])


def test_opset_changes_attributes_to_inputs():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    old = helper.make_node("ReduceSum", ["x"], ["y"], axes=[1], keepdims=0)
    new = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)
    a = TorchBackend.run_node(old, [x], opset_version=11)[0]
    b = TorchBackend.run_node(new, [x, np.array([1])], opset_version=18)[0]
    np.testing.assert_array_equal(a, x.sum(axis=1))
    np.testing.assert_array_equal(b, x.sum(axis=1))
    old = helper.make_node("Pad", ["x"], ["y"], pads=[0, 1, 0, 0, 1, 0], mode="edge")
    new = helper.make_node("Pad", ["x", "pads"], ["y"], mode="edge")
    expected = np.pad(x, [(0, 0), (1, 1), (0, 0)], mode="edge")
    np.testing.assert_array_equal(TorchBackend.run_node(old, [x], opset_version=10)[0], expected)
    np.testing.assert_array_equal(TorchBackend.run_node(
        new, [x, np.array([0, 1, 0, 0, 1, 0])], opset_version=18)[0], expected)


def test_cuda_device_runs_where_torch_sees_a_gpu():
    model, _ = small_cnn()
    x = inputs()
    if not torch.cuda.is_available():
        assert not TorchBackend.supports_device("CUDA")
        with pytest.raises(UsageError, match="CUDA"):
            TorchBackend.prepare(model, device="CUDA")
        return
    gpu = TorchBackend.prepare(model, device="CUDA")
    assert next(gpu.native.parameters()).is_cuda
    np.testing.assert_allclose(gpu.run([x])[0], TorchBackend.prepare(model).run([x])[0],
                               rtol=1e-6)
    _, grads = gpu.gradients([x])
    assert grads["w"].shape == (4, 2, 3, 3)


@pytest.mark.parametrize("kind", ["transformer", "lstm"])
def test_models_exported_by_torch_round_trip(kind):
    import io
    import warnings
    torch.manual_seed(0)
    if kind == "transformer":
        model = torch.nn.Sequential(  # (a bare layer trips the TorchScript exporter)
            torch.nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, dropout=0.0),
            torch.nn.LayerNorm(16))
    else:
        model = torch.nn.LSTM(16, 8, batch_first=True, bidirectional=True)
    model.eval()
    x = torch.randn(2, 5, 16)
    xg = x.clone().requires_grad_(True)
    y = model(xg)
    y = y[0] if isinstance(y, tuple) else y
    (expected,) = torch.autograd.grad(y.sum(), [xg])
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), buffer, dynamo=False, opset_version=17)
    rep = TorchBackend.prepare(onnx.load_from_string(buffer.getvalue()))
    outs, grads = rep.gradients([x.numpy()])
    np.testing.assert_allclose(outs[0], y.detach().numpy(), rtol=1e-5, atol=1e-6)
    name = rep.input_names[0]
    np.testing.assert_allclose(grads[name], expected.numpy(), rtol=1e-4, atol=1e-5)
