"""torch's MatMul at inference: a wide matrix stored transposed (a tied output projection over a
vocabulary) runs as oneDNN's linear and agrees with NumPy; a narrow one, one stored as is, and
gradients keep torch.matmul."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from d500.backends import get
from d500.backends.torch.linalg import WIDE


def _tied(k: int = 8, n: int = WIDE, extra: tuple[int, ...] = (2, 5), transposed: bool = True):
    """y = x @ Transpose(E), E [n, k] an initializer (b is E's transposed view), or, with
    `transposed=False`, y = x @ W with W = E^T stored [k, n]."""
    rng = np.random.default_rng(0)
    e = rng.normal(size=(n, k)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"])]
    if transposed:
        nodes.insert(0, helper.make_node("Transpose", ["E"], ["W"], perm=[1, 0]))
    weight = numpy_helper.from_array(e, "E") if transposed else numpy_helper.from_array(
        np.ascontiguousarray(e.T), "W")
    graph = helper.make_graph(
        nodes, "tied", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*extra, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*extra, n])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, e, rng.normal(size=(*extra, k)).astype(np.float32)


def _kernels(fn) -> set[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key for e in prof.key_averages()}


@pytest.mark.parametrize("extra", [(2, 5), (7,)])
def test_a_transposed_weight_runs_as_onednn_linear_and_agrees(extra):
    model, e, x = _tied(extra=extra)
    exe = get("torch").prepare(model)
    kernels = _kernels(lambda: exe.run({"x": x}))
    assert "mkldnn::_linear_pointwise" in kernels and "aten::mm" not in kernels
    y = exe.run({"x": x})[0]
    expected = x.astype(np.float64) @ e.T.astype(np.float64)
    assert y.shape == (*extra, WIDE)
    assert np.max(np.abs(y - expected)) <= 1e-5 * np.max(np.abs(expected))


def test_a_weight_stored_as_is_and_gradients_keep_torch_matmul():
    model, e, x = _tied()
    exe = get("torch").prepare(model)
    _, grads = exe.gradients({"x": x}, output="y", wrt=["E"])
    # d sum(x E^T) / dE = x summed over its batch dimensions, for every row of E
    expected = np.broadcast_to(x.reshape(-1, x.shape[-1]).sum(0), e.shape)
    assert np.allclose(grads["E"], expected, rtol=1e-5, atol=1e-4)
    plain = get("torch").prepare(_tied(transposed=False)[0])
    assert "mkldnn::_linear_pointwise" not in _kernels(lambda: plain.run({"x": x}))
    assert np.allclose(plain.run({"x": x})[0], exe.run({"x": x})[0], rtol=1e-5, atol=1e-5)
    narrow, _, x = _tied(n=WIDE - 1)
    assert "aten::mm" in _kernels(lambda: get("torch").prepare(narrow).run({"x": x}))


@pytest.mark.slow  # Inductor compiles the program (seconds)
def test_torch_compiled_records_onednn_linear_into_its_inference_program(tmp_path, monkeypatch):
    """torch:compiled traces inference with grad off, so the wide tied projection enters its
    program as oneDNN's linear (not an mm that Inductor's freezing would pack for MKL)."""
    monkeypatch.setenv("D500_HOME", str(tmp_path))
    model, e, x = _tied()
    exe = get("torch:compiled").prepare(model)
    y = exe.run({"x": x})[0]
    expected = x.astype(np.float64) @ e.T.astype(np.float64)
    assert np.max(np.abs(y - expected)) <= 1e-5 * np.max(np.abs(expected))
    (fn, _, _), = exe._compiled.programs.values()
    targets = {n.target for n in fn._orig_mod.graph.nodes if n.op == "call_function"}
    assert torch.ops.mkldnn._linear_pointwise.default in targets
    assert torch.ops.aten.mm.default not in targets
