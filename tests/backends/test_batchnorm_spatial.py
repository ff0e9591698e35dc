"""BatchNormalization-7's spatial attribute on the reference, torch and tensorflow backends:
spatial=0 (scale, B, mean, var of shape C x D1 x ... x Dn, broadcast over the batch axis only)
on 4-D and 2-D inputs, after a convolution too, forward and gradients; spatial=1 unchanged.

The judges: onnxruntime, which implements spatial=0 in its opset-7 kernel, on the very model, and
onnx's ReferenceEvaluator (which ignores spatial) on the equivalent BN-9's documentation gives
for such models: x flattened to N x C*D1*...*Dn, BatchNormalization-15, reshaped back.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from d500 import backends

BACKENDS = ["reference", "torch", "tensorflow"]
EPS = 1e-3
PARAMS = ("scale", "B", "mean", "var")


def parameters(shape: tuple[int, ...], seed: int) -> dict[str, np.ndarray]:
    """scale, B, mean, var of `shape`; var in [0.5, 1.5) so no value is near the epsilon."""
    rng = np.random.default_rng(seed)
    values = {k: rng.normal(size=shape).astype(np.float32) for k in ("scale", "B", "mean")}
    values["var"] = (rng.random(shape) + 0.5).astype(np.float32)
    return values


def bn7(x_shape: tuple[int, ...], spatial: int, seed: int = 0, conv: bool = False,
        training: bool = False) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """An opset-7 model x [-> Conv 3x3 pad 1] -> BatchNormalization(spatial) -> y, its
    statistics as initializers of shape (C, D1, ..., Dn) (spatial=0) or (C,) (spatial=1);
    training: the five-output training form of BN-7. Returns the model and its parameters."""
    c = x_shape[1]
    params = parameters(tuple(x_shape[1:]) if not spatial else (c,), seed)
    inits = [numpy_helper.from_array(v, k) for k, v in params.items()]
    nodes, bn_in = [], "x"
    if conv:
        w = np.random.default_rng(seed + 1).normal(size=(c, c, 3, 3)).astype(np.float32) / 3
        params["w"] = w
        inits.append(numpy_helper.from_array(w, "w"))
        nodes.append(helper.make_node("Conv", ["x", "w"], ["h"], pads=[1, 1, 1, 1]))
        bn_in = "h"
    outs = ["y", "mean_out", "var_out", "saved_mean", "saved_var"] if training else ["y"]
    nodes.append(helper.make_node("BatchNormalization", [bn_in, *PARAMS], outs, epsilon=EPS,
                                  spatial=spatial))
    # IR 3, as opset-7 exporters wrote it: the initializers are graph inputs too
    graph = helper.make_graph(
        nodes, "bn7", [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape)
                       for k, v in {"x": np.empty(x_shape), **params}.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, x_shape)], inits)
    if training:
        graph.output.extend(helper.make_tensor_value_info(o, TensorProto.FLOAT,
                                                          params["mean"].shape)
                            for o in outs[1:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 7)], ir_version=3)
    onnx.checker.check_model(model, full_check=True)
    return model, params


def flattened_bn15(x_shape: tuple[int, ...], params: dict[str, np.ndarray],
                   training: bool = False) -> onnx.ModelProto:
    """BN-7 spatial=0 as BN-9's documentation rewrites it: x -> Reshape(N, C*D1*...*Dn) ->
    BatchNormalization-15 with flattened statistics -> Reshape back (no convolution)."""
    n, size = x_shape[0], int(np.prod(x_shape[1:]))
    inits = [numpy_helper.from_array(params[k].reshape(-1), k) for k in PARAMS]
    inits += [numpy_helper.from_array(np.array([n, size], np.int64), "flat_shape"),
              numpy_helper.from_array(np.array(x_shape, np.int64), "x_shape")]
    outs = ["z", "mean_out", "var_out"] if training else ["z"]
    nodes = [helper.make_node("Reshape", ["x", "flat_shape"], ["flat"]),
             helper.make_node("BatchNormalization", ["flat", *PARAMS], outs, epsilon=EPS,
                              training_mode=int(training)),
             helper.make_node("Reshape", ["z", "x_shape"], ["y"])]
    graph = helper.make_graph(
        nodes, "bn15_flat", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, x_shape)]
        + [helper.make_tensor_value_info(o, TensorProto.FLOAT, [size]) for o in outs[1:]], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    onnx.checker.check_model(model, full_check=True)
    return model


def onnxruntime_run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    return session.run(["y"], {"x": x})[0]


def inputs(x_shape: tuple[int, ...], seed: int = 10) -> np.ndarray:
    """x with per-activation offsets, so statistics of the wrong shape would show."""
    rng = np.random.default_rng(seed)
    offsets = rng.normal(size=x_shape[1:]) * 2
    return (rng.normal(size=x_shape) + offsets).astype(np.float32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("x_shape", [(4, 3, 5, 6), (4, 6)], ids=["4d", "2d"])
def test_spatial_0_normalises_per_activation(backend, x_shape):
    model, params = bn7(x_shape, spatial=0)
    x = inputs(x_shape)
    by_onnxruntime = onnxruntime_run(model, x)
    by_reference_evaluator = ReferenceEvaluator(flattened_bn15(x_shape, params)).run(
        None, {"x": x})[0]
    np.testing.assert_allclose(by_onnxruntime, by_reference_evaluator, rtol=1e-5, atol=1e-5)
    (y,) = backends.get(backend).prepare(model).run([x])
    assert y.shape == x_shape and y.dtype == np.float32
    np.testing.assert_allclose(y, by_reference_evaluator, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, by_onnxruntime, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_spatial_0_after_a_convolution(backend):
    """On tensorflow the convolution's output is channels-last; the statistics stay C x H x W."""
    x_shape = (2, 4, 6, 5)
    model, _ = bn7(x_shape, spatial=0, conv=True, seed=3)
    x = inputs(x_shape, seed=4)
    (y,) = backends.get(backend).prepare(model).run([x])
    np.testing.assert_allclose(y, onnxruntime_run(model, x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("conv", [False, True], ids=["bn", "conv-bn"])
def test_spatial_1_unchanged(backend, conv):
    x_shape = (4, 3, 5, 6)
    model, params = bn7(x_shape, spatial=1, conv=conv, seed=5)
    x = inputs(x_shape, seed=6)
    (y,) = backends.get(backend).prepare(model).run([x])
    np.testing.assert_allclose(y, onnxruntime_run(model, x), rtol=1e-4, atol=1e-4)
    if not conv:  # and per channel, as BatchNormalization-15 computes it
        bn15 = helper.make_model(helper.make_graph(
            [helper.make_node("BatchNormalization", ["x", *PARAMS], ["y"], epsilon=EPS)], "bn15",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, x_shape)],
            [numpy_helper.from_array(v, k) for k, v in params.items()]),
            opset_imports=[helper.make_opsetid("", 15)])
        expected = ReferenceEvaluator(bn15).run(None, {"x": x})[0]
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_spatial_0_gradients(backend):
    """Gradients of <y, g> with respect to x and the four C x H x W statistics, against torch
    autograd on the definition y = scale * (x - mean) / sqrt(var + eps) + B."""
    x_shape = (3, 2, 4, 5)
    model, params = bn7(x_shape, spatial=0, seed=7)
    x = inputs(x_shape, seed=8)
    g = np.random.default_rng(9).normal(size=x_shape).astype(np.float32)
    (y,), grads = backends.get(backend).prepare(model).gradients(
        [x], grad_outputs={"y": g})
    t = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True)
         for k, v in {**params, "x": x}.items()}
    expected = t["scale"] * (t["x"] - t["mean"]) / torch.sqrt(t["var"] + EPS) + t["B"]
    (expected * torch.tensor(g, dtype=torch.float64)).sum().backward()
    np.testing.assert_allclose(y, expected.detach().numpy(), rtol=1e-5, atol=1e-5)
    assert set(grads) == {"x", *PARAMS}
    for name in grads:
        assert grads[name].shape == t[name].shape, name
        np.testing.assert_allclose(grads[name], t[name].grad.numpy(), rtol=1e-4, atol=1e-4,
                                   err_msg=name)


def test_reference_training_form_spatial_0_uses_per_activation_batch_statistics():
    """BN-7's five-output training form on the reference backend: batch statistics over the
    batch axis only, running statistics of shape C x H x W updated by momentum 0.9."""
    x_shape = (5, 2, 3, 4)
    model, params = bn7(x_shape, spatial=0, training=True, seed=11)
    x = inputs(x_shape, seed=12)
    y, mean_out, var_out, saved_mean, saved_var = backends.get("reference").prepare(
        model).run([x])
    expected = ReferenceEvaluator(flattened_bn15(x_shape, params, training=True)).run(
        None, {"x": x})
    np.testing.assert_allclose(y, expected[0], rtol=1e-5, atol=1e-5)
    for got, want in ((mean_out, expected[1]), (var_out, expected[2]),
                      (saved_mean, x.mean(axis=0)), (saved_var, x.var(axis=0))):
        assert got.shape == x_shape[1:]
        np.testing.assert_allclose(got, np.reshape(want, x_shape[1:]), rtol=1e-5, atol=1e-5)
