"""The JAX backend: forward against the reference and native JAX, 64-bit types kept to the
backend, shape inputs baked per value, parameters, dtypes, sequences, errors."""

from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest
from onnx import TensorProto, helper

try:
    importlib.metadata.version("jax")
except importlib.metadata.PackageNotFoundError:
    pytest.skip("jax is not installed (pip install 'd500[jax]')", allow_module_level=True)
import backend_checks  # noqa: E402
import jax  # noqa: E402 - only once it is known to be installed
import jax.numpy as jnp  # noqa: E402
from small_cnn import inputs, small_cnn  # noqa: E402

from d500.backends.jax import JaxBackend  # noqa: E402
from d500.errors import UsageError  # noqa: E402


def native_cnn(x, p):
    """The same network written directly in JAX (NCHW)."""
    h = jax.lax.conv_general_dilated(x, p["w"], (2, 2), [(1, 1), (1, 1)],
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                     precision="highest") + p["b"][:, None, None]
    c = (slice(None), None, None)
    h = (h - p["mean"][c]) / jnp.sqrt(p["var"][c] + 1e-5) * p["scale"][c] + p["shift"][c]
    h = jax.lax.reduce_window(jax.nn.relu(h), -jnp.inf, jax.lax.max, (1, 1, 2, 2),
                              (1, 1, 2, 2), "VALID")
    return jax.nn.softmax(h.reshape(2, -1) @ p["fc_w"].T + p["fc_b"], axis=1)


@pytest.fixture(scope="module")
def cnn():
    model, weights = small_cnn()
    return JaxBackend.prepare(model), weights, inputs()


def test_forward_matches_reference_and_native(cnn):
    rep, weights, x = cnn
    y = backend_checks.forward_matches_reference(rep, x)
    with jax.enable_x64(True):
        native = native_cnn(jnp.asarray(x), {k: jnp.asarray(v) for k, v in weights.items()})
    np.testing.assert_allclose(y, np.asarray(native), rtol=1e-10, atol=1e-12)


def test_64_bits_inside_the_backend_only():
    """float64 and int64 are computed as such, float32 stays float32, and JAX's own 32-bit
    default outside the backend is untouched."""
    nodes = [helper.make_node("Add", ["a", "a"], ["a2"]), helper.make_node("Mul", ["f", "f"],
                                                                          ["f2"]),
             helper.make_node("Add", ["i", "i"], ["i2"])]
    graph = helper.make_graph(
        nodes, "widths", [helper.make_tensor_value_info("a", TensorProto.DOUBLE, [2]),
                          helper.make_tensor_value_info("f", TensorProto.FLOAT, [2]),
                          helper.make_tensor_value_info("i", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info(n, t, [2]) for n, t in (
            ("a2", TensorProto.DOUBLE), ("f2", TensorProto.FLOAT), ("i2", TensorProto.INT64))])
    rep = JaxBackend.prepare(helper.make_model(graph))
    a = np.array([1 + 1e-12, 2.0])
    big = np.array([2**40, 3], np.int64)
    a2, f2, i2 = rep.run([a, np.array([1.5, 3.0], np.float32), big])
    assert a2.dtype == np.float64 and a2[0] == 2 + 2e-12
    assert f2.dtype == np.float32 and f2.tolist() == [2.25, 9.0]
    assert i2.dtype == np.int64 and i2[0] == 2**41
    assert not jax.config.jax_enable_x64
    assert jnp.asarray(np.ones(1)).dtype == jnp.float32


def test_parameters_and_set_parameters(cnn):
    rep, weights, x = cnn
    params = rep.parameters()
    assert set(params) == set(weights) and params["w"].shape == (4, 2, 3, 3)
    before = rep.run([x])[0]
    rep.set_parameters({"fc_b": weights["fc_b"] + np.array([5.0, 0.0, 0.0])})
    try:
        assert np.all(rep.run([x])[0][:, 0] > before[:, 0])
    finally:
        rep.set_parameters({"fc_b": weights["fc_b"]})
    np.testing.assert_allclose(rep.run([x])[0], before)
    with pytest.raises(UsageError, match="not a parameter"):
        rep.set_parameters({"nope": np.zeros(1)})


def test_gradients_agree_with_torch(cnn):
    """Executable.gradients: of the summed first output, of given output gradients, `wrt` a
    subset; the same as torch's to float32 rounding, for parameters and the input."""
    from d500 import backends
    rep, _, x = cnn
    torch_rep = backends.get("torch").prepare(rep.model)
    (logits,) = rep.run([x])
    g = np.random.default_rng(2).normal(size=logits.shape).astype(np.float32)
    for kwargs in ({}, {"grad_outputs": {rep.output_names[0]: g}}, {"wrt": ["w", "x"]}):
        outs, grads = rep.gradients({"x": x}, **kwargs)
        want_outs, want = torch_rep.gradients({"x": x}, **kwargs)
        np.testing.assert_allclose(outs[0], want_outs[0], rtol=1e-5, atol=1e-6)
        assert sorted(grads) == sorted(want) and grads
        for name, value in want.items():
            assert grads[name].dtype == value.dtype and grads[name].flags.writeable
            np.testing.assert_allclose(grads[name], value, rtol=1e-4,
                                       atol=1e-9 + 1e-5 * np.abs(value).max(), err_msg=name)
    with pytest.raises(UsageError, match="cannot differentiate with respect to 'nope'"):
        rep.gradients({"x": x}, wrt=["nope"])


def test_shape_inputs_are_baked_per_value():
    rep = backend_checks.shape_inputs_are_baked_per_value(JaxBackend)
    assert rep._bake == {"shape"} and len(rep._functions) == 3


def test_unsigned_arithmetic_and_output_dtypes():
    backend_checks.unsigned_arithmetic_and_output_dtypes(JaxBackend)


def test_sequences_are_python_lists():
    backend_checks.sequences_are_python_lists(JaxBackend)


def test_unsupported_operator_names_everything():
    backend_checks.unsupported_operator_names_everything(JaxBackend)


def test_registered_and_input_errors(cnn):
    from d500 import backends
    assert backends.get("jax") is JaxBackend and JaxBackend.trainable
    rep, _, x = cnn
    with pytest.raises(UsageError, match="2 inputs given"):
        rep.run([x, x])
