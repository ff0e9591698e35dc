"""The JAX backend runs convolutions channels-last (core.ChannelsLast): values held so leave every
path (run, gradients, eager, a graph output that is a Conv's or an Add's) in ONNX's layout, and
XLA's jitted backward moves no activation between layouts, as it did with NCHW convolutions."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("jax")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from d500 import backends  # noqa: E402

N, C, S = 4, 8, 12  # batch, channels, image side


def net(seed: int = 0, training: bool = False):
    """Conv -> BN (training form when asked) -> Relu -> Conv -> Add (the first activation) ->
    outputs: the Add itself and GlobalAveragePool of it, flattened."""
    rng = np.random.default_rng(seed)
    w = {"w1": rng.normal(0, 0.3, (C, 3, 3, 3)), "b1": rng.normal(0, 0.1, C),
         "w2": rng.normal(0, 0.2, (C, C, 3, 3)), "scale": rng.uniform(0.5, 1.5, C),
         "shift": rng.normal(0, 0.1, C), "mean": rng.normal(0, 0.1, C),
         "var": rng.uniform(0.5, 1.5, C)}
    bn_out = ["n", "rm", "rv"] if training else ["n"]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 4),
             helper.make_node("BatchNormalization", ["c1", "scale", "shift", "mean", "var"],
                              bn_out, epsilon=1e-5, training_mode=int(training)),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["c2"], pads=[1] * 4),
             helper.make_node("Add", ["c2", "c1"], ["y"]),
             helper.make_node("GlobalAveragePool", ["y"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"])]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N, C, S, S]),
           helper.make_tensor_value_info("f", TensorProto.FLOAT, [N, C])]
    graph = helper.make_graph(
        nodes, "layout", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N, 3, S, S])],
        out, [numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


@pytest.mark.slow  # JAX compiles: 16 s and 4 s at load 11
@pytest.mark.parametrize("training", [False, True])
def test_channels_last_values_leave_in_onnx_layout(training):
    model = net(training=training)
    x = np.random.default_rng(1).standard_normal((N, 3, S, S)).astype(np.float32)
    expected = backends.get("reference").prepare(model).run([x])
    torch_outs, torch_grads = backends.get("torch").prepare(model).gradients([x], output="f")
    for name in ("jax", "jax:eager"):
        exe = backends.get(name).prepare(model)
        for got, want in zip(exe.run([x]), expected):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        outs, grads = exe.gradients([x], output="f")
        assert outs[0].shape == (N, C, S, S)
        for k, g in torch_grads.items():
            np.testing.assert_allclose(grads[k], g, rtol=1e-3, atol=1e-4, err_msg=f"{name} {k}")


def _moved_activations(fn, *args) -> int:
    """Transposes of activation-sized arrays (N*C*S*S elements: not the 3-channel input, which
    d500 takes NCHW) in XLA's compiled module of jax.jit(fn)."""
    text = jax.jit(fn).lower(*args).compile().as_text()
    found = 0
    for dims in re.findall(r"= f32\[([0-9,]+)\]\{[^}]*\} transpose\(", text):
        found += np.prod([int(d) for d in dims.split(",")]) >= N * C * S * S
    return found


def _native(layout: str):
    """The same network in plain JAX, in `layout` ("NCHW" or "NHWC")."""
    def conv(x, w, spec):
        return jax.lax.conv_general_dilated(x, w, (1, 1), [(1, 1)] * 2,
                                            dimension_numbers=(spec, "OIHW", spec))

    def f(p, x):
        ch = (lambda v: v.reshape(1, -1, 1, 1)) if layout == "NCHW" else (lambda v: v)
        a = p["scale"] * jax.lax.rsqrt(p["var"] + 1e-5)
        c1 = conv(x, p["w1"], layout) + ch(p["b1"])
        r = jax.nn.relu(c1 * ch(a) + ch(p["shift"] - p["mean"] * a))
        y = conv(r, p["w2"], layout) + c1
        return jnp.sum(jnp.mean(y, axis=(2, 3) if layout == "NCHW" else (1, 2)))
    return f


def test_the_jitted_backward_moves_no_activation_between_layouts():
    model = net()
    exe = backends.get("jax").prepare(model)
    graph, params = exe.pure()
    x = jnp.zeros((N, 3, S, S), jnp.float32)
    d500 = _moved_activations(jax.grad(lambda p, v: jnp.sum(graph(p, {"x": v})[1]), (0, 1)),
                              params, x)
    nchw = _moved_activations(jax.grad(_native("NCHW"), (0, 1)), params, x)
    nhwc = _moved_activations(jax.grad(_native("NHWC"), (0, 1)), params,
                              jnp.zeros((N, S, S, 3), jnp.float32))
    assert nchw > nhwc  # what the measure tells apart: XLA's moves around NCHW convolutions
    assert d500 <= nhwc, (d500, nchw, nhwc)
