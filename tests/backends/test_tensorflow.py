"""The TensorFlow backend: ONNX node suite and light models, gradients, shape inputs, errors."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest


def _installed(*distributions: str) -> bool:
    for name in distributions:
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return True
    return False


# Skipped only where TensorFlow is not installed at all (d500 without its [tensorflow] extra);
# an installed TensorFlow that fails to import fails here instead of skipping 11 tests silently.
if not _installed("tensorflow-cpu", "tensorflow"):
    pytest.skip("tensorflow is not installed (pip install 'd500[tensorflow]')",
                allow_module_level=True)
import backend_checks  # noqa: E402
import tensorflow as tf  # noqa: E402 - only once it is known to be installed
from small_cnn import inputs, small_cnn  # noqa: E402

from d500.backends.tensorflow import TensorFlowBackend  # noqa: E402
from d500.errors import UsageError  # noqa: E402


# -- a small CNN, in ONNX and natively in TensorFlow with the same weights ---------------------
def native_cnn(x: tf.Tensor, p: dict[str, tf.Tensor]) -> tf.Tensor:
    """The same network written directly in TensorFlow (NHWC)."""
    h = tf.transpose(x, [0, 2, 3, 1])
    h = tf.nn.conv2d(tf.pad(h, [[0, 0], [1, 1], [1, 1], [0, 0]]),
                     tf.transpose(p["w"], [2, 3, 1, 0]), 2, "VALID") + p["b"]
    h = (h - p["mean"]) / tf.sqrt(p["var"] + 1e-5) * p["scale"] + p["shift"]
    h = tf.nn.max_pool2d(tf.nn.relu(h), 2, 2, "VALID")
    h = tf.reshape(tf.transpose(h, [0, 3, 1, 2]), [2, -1])
    return tf.nn.softmax(h @ tf.transpose(p["fc_w"]) + p["fc_b"], axis=1)


@pytest.fixture(scope="module")
def cnn():
    model, weights = small_cnn()
    return TensorFlowBackend.prepare(model), weights, inputs()


def test_forward_matches_reference_and_native(cnn):
    rep, weights, x = cnn
    y = backend_checks.forward_matches_reference(rep, x)
    native = native_cnn(tf.constant(x), {k: tf.constant(v) for k, v in weights.items()})
    np.testing.assert_allclose(y, native.numpy(), rtol=1e-10, atol=1e-12)


def test_gradients_match_native_autodiff(cnn):
    rep, weights, x = cnn
    g_out = np.random.default_rng(2).normal(size=(2, 3))
    outs, grads = rep.gradients([x], grad_outputs={"y": g_out})
    assert set(grads) == set(weights) | {"x"}
    params = {k: tf.Variable(v) for k, v in weights.items()}
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = native_cnn(xt, params)
        target = tf.reduce_sum(y * g_out)
    names = list(params)
    expected = tape.gradient(target, [params[k] for k in names] + [xt])
    np.testing.assert_allclose(outs[0], y.numpy(), rtol=1e-10)
    for name, g in zip(names + ["x"], expected):
        np.testing.assert_allclose(grads[name], g.numpy(), rtol=1e-8, atol=1e-12,
                                   err_msg=name)
    assert np.abs(grads["mean"]).max() > 0  # running statistics are parameters too


def test_gradients_match_finite_differences(cnn):
    rep, weights, x = cnn
    g_out = np.random.default_rng(3).normal(size=(2, 3))
    _, grads = rep.gradients([x], grad_outputs={"y": g_out}, wrt=["w", "var", "fc_b", "x"])
    assert set(grads) == {"w", "var", "fc_b", "x"}

    def f(name, value):
        if name == "x":
            return float(np.sum(rep.run([value])[0] * g_out))
        original = rep.parameters()[name]
        rep.set_parameters({name: value})
        try:
            return float(np.sum(rep.run([x])[0] * g_out))
        finally:
            rep.set_parameters({name: original})

    rng = np.random.default_rng(4)
    for name in grads:
        base = x if name == "x" else weights[name]
        for _ in range(3):  # a few random coordinates per tensor
            idx = tuple(rng.integers(0, d) for d in base.shape)
            h = 1e-6
            plus, minus = base.copy(), base.copy()
            plus[idx] += h
            minus[idx] -= h
            numeric = (f(name, plus) - f(name, minus)) / (2 * h)
            assert abs(grads[name][idx] - numeric) <= 1e-5 * (1 + abs(numeric)), (name, idx)


def test_parameters_native_module_and_errors(cnn):
    rep, weights, x = cnn
    assert set(rep.parameters()) == set(weights)
    module = rep.native
    assert isinstance(module, tf.Module)
    assert {v.shape.as_list() == list(weights[k].shape) for k, v in module.params.items()} == {
        True}
    # BatchNormalization's running statistics are non-trainable variables, as in Keras
    assert len(module.trainable_variables) == len(weights) - 2
    assert not module.params["mean"].trainable and not module.params["var"].trainable
    with tf.GradientTape() as tape:  # framework-native training works on the module
        loss = tf.reduce_sum(module([x])[0][:, 0])
    grads = tape.gradient(loss, module.trainable_variables)
    assert all(g is not None for g in grads)
    with pytest.raises(UsageError, match="not a parameter"):
        rep.set_parameters({"nosuch": np.zeros(1)})
    with pytest.raises(UsageError, match="shape"):
        rep.set_parameters({"b": np.zeros(5)})
    with pytest.raises(UsageError, match="not an output"):
        rep.gradients([x], output="nosuch")


def test_set_parameters_changes_the_output(cnn):
    rep, weights, x = cnn
    before = rep.run([x])[0]
    rep.set_parameters({"fc_b": weights["fc_b"] + np.array([5.0, 0.0, 0.0])})
    try:
        after = rep.run([x])[0]
        assert np.all(after[:, 0] > before[:, 0])
    finally:
        rep.set_parameters({"fc_b": weights["fc_b"]})
    np.testing.assert_allclose(rep.run([x])[0], before)


# -- shape inputs, dtypes, sequences ------------------------------------------------------------
def test_shape_inputs_are_baked_per_value():
    backend_checks.shape_inputs_are_baked_per_value(TensorFlowBackend)


def test_unsigned_arithmetic_and_output_dtypes():
    backend_checks.unsigned_arithmetic_and_output_dtypes(TensorFlowBackend)


def test_sequences_are_python_lists():
    backend_checks.sequences_are_python_lists(TensorFlowBackend)


# -- errors ---------------------------------------------------------------------------------------
def test_unsupported_operator_names_everything():
    backend_checks.unsupported_operator_names_everything(TensorFlowBackend)


def test_unknown_device_and_input_errors(cnn):
    rep, _, x = cnn
    if not tf.config.list_physical_devices("GPU"):
        assert not TensorFlowBackend.supports_device("CUDA")
        with pytest.raises(UsageError, match="CUDA"):
            TensorFlowBackend.prepare(rep.model, device="CUDA")
    with pytest.raises(UsageError, match="2 inputs given"):
        rep.run([x, x])


def test_a_broken_tensorflow_install_fails_this_file_instead_of_skipping(tmp_path):
    # found before the real one: an install that lost a module it imports (ModuleNotFoundError,
    # which pytest.importorskip would have turned into a silent skip of the whole file)
    shadow = tmp_path / "tensorflow"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("import tensorflow_lost_part_of_the_install\n")
    here = Path(__file__)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
         "--collect-only", str(here)], check=False, capture_output=True, text=True,
        timeout=300, cwd=here.parents[2], env={**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(tmp_path), os.environ.get("PYTHONPATH", "")])})
    assert result.returncode == 2, result.stdout  # pytest's "errors during collection"
    assert "tensorflow_lost_part_of_the_install" in result.stdout
    assert "SKIPPED" not in result.stdout


def test_importing_the_backend_leaves_out_keras_extras_that_import_as_usual_later():
    # Keras, which `import tensorflow` loads, would import scikit-learn, pandas and matplotlib
    # (all installed here) in every process that imports TensorFlow: a third of its import
    code = ("import sys\n"
            "from d500 import backends\n"
            "backends.get('tensorflow')\n"
            "from d500.backends.tensorflow.framework import KERAS_EXTRAS\n"
            "print(sorted(m for m in KERAS_EXTRAS if m in sys.modules))\n"
            "import keras, sklearn.base, pandas, matplotlib.figure\n"  # later: as usual
            "print(keras.optimizers.SGD(0.1).learning_rate.numpy() > 0)\n")
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True,
                            text=True, timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["[]", "True"], result.stdout
