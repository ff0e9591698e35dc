"""tensorflow:xla: the TensorFlow backend's tf.functions compiled with XLA (jit_compile=True),
for inference, gradients and the trainer's step (d500's optimizers and Keras'); what XLA refuses
is one error naming the TensorFlow operations."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from d500 import backends
from d500.builders import build
from d500.errors import ModelError

pytest.importorskip("tensorflow")


def test_xla_runs_and_differentiates_as_the_graph_mode_does():
    model = build("mlp", "digits", loss=True)
    rng = np.random.default_rng(0)
    feeds = {"input": rng.random((4, 1, 8, 8), dtype=np.float32),
             "labels": rng.integers(0, 10, 4).astype(np.int64)}
    graph, xla = (backends.get(n).prepare(model) for n in ("tensorflow", "tensorflow:xla"))
    assert (graph.settings(), xla.settings()) == ({"jit_compile": False},
                                                  {"jit_compile": True})
    want = backends.get("reference").prepare(model).run(feeds)
    got = xla.run(feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    _, g_graph = graph.gradients(feeds, output="loss")
    _, g_xla = xla.gradients(feeds, output="loss")
    assert set(g_xla) == set(g_graph)
    for name, value in g_graph.items():
        np.testing.assert_allclose(g_xla[name], value, rtol=1e-4, atol=1e-6)


def test_an_operation_xla_refuses_is_named():
    graph = helper.make_graph([helper.make_node("Unique", ["x"], ["y"], sorted=0)], "uniq",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.array([2, 1, 2, 3, 1], np.float32)
    np.testing.assert_array_equal(backends.get("tensorflow").prepare(model).run([x])[0],
                                  [2, 1, 3])
    with pytest.raises(ModelError) as err:
        backends.get("tensorflow:xla").prepare(model).run([x])
    text = str(err.value)
    assert "XLA cannot compile the TensorFlow operation(s)" in text and "tensorflow:xla" in text
    assert text.count("\n") == 0


@pytest.mark.parametrize("native", [False, True])
def test_a_training_step_compiled_by_xla_takes_the_graph_modes_steps(native):
    from d500.training.optimizers.registry import make
    rng = np.random.default_rng(0)
    feeds = [{"input": rng.random((16, 1, 8, 8), dtype=np.float32),
              "labels": rng.integers(0, 10, 16).astype(np.int64)} for _ in range(5)]
    losses = {}
    for name in ("tensorflow", "tensorflow:xla"):
        exe = backends.get(name).prepare(build("mlp", (1, 8, 8), 10, seed=0, loss=True))
        trainer = exe.trainer(make("momentum", lr=0.05), loss="loss", native=native)
        assert trainer.jit == ({"jit_compile": True} if name.endswith("xla") else {})
        losses[name] = [trainer.step(f, 0.05) for f in feeds]
    np.testing.assert_allclose(losses["tensorflow:xla"], losses["tensorflow"], rtol=1e-5)
    assert losses["tensorflow"][-1] < losses["tensorflow"][0]
