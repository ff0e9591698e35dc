"""Seeded network inputs: default sizes of open dimensions, labels in range, .npz files checked."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from d500.errors import UsageError
from d500.networks import inputs


def _model(*values: onnx.ValueInfoProto) -> onnx.ModelProto:
    outs = [helper.make_tensor_value_info(f"y{i}", v.type.tensor_type.elem_type, None)
            for i, v in enumerate(values)]
    nodes = [helper.make_node("Identity", [v.name], [f"y{i}"]) for i, v in enumerate(values)]
    return helper.make_model(helper.make_graph(nodes, "g", list(values), outs))


def test_open_dims_get_documented_defaults_and_named_dims_agree():
    m = _model(helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", None]),
               helper.make_tensor_value_info("n", TensorProto.INT64, ["N"]),
               helper.make_tensor_value_info("h", TensorProto.FLOAT, [5, "H"]))
    feeds = inputs.make(m, seed=0)
    assert feeds["x"].shape == (inputs.DEFAULT_BATCH, 3, inputs.DEFAULT_DIM, inputs.DEFAULT_DIM)
    assert feeds["n"].shape == (inputs.DEFAULT_BATCH,)
    assert feeds["h"].shape == (5, inputs.DEFAULT_DIM)
    assert feeds["x"].dtype == np.float32 and feeds["n"].dtype == np.int64
    sized = inputs.make(m, seed=0, batch=7, dims={"H": 4})
    assert sized["x"].shape == (7, 3, 4, inputs.DEFAULT_DIM) and sized["h"].shape == (5, 4)


def test_same_seed_same_values_other_seed_other_values():
    m = _model(helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4]))
    np.testing.assert_array_equal(inputs.make(m, 3)["x"], inputs.make(m, 3)["x"])
    assert not np.array_equal(inputs.make(m, 3)["x"], inputs.make(m, 4)["x"])


def test_labels_of_a_loss_are_drawn_below_the_number_of_classes():
    from d500 import builders
    m = builders.build("mlp", (1, 8, 8), classes=3, loss=True)
    labels = inputs.make(m, seed=0, batch=500)["labels"]
    assert labels.dtype == np.int64 and labels.min() >= 0 and labels.max() == 2


def test_unknown_dim_name_is_a_usage_error():
    m = _model(helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3]))
    with pytest.raises(UsageError, match="no input dimension named 'M'"):
        inputs.make(m, dims={"M": 2})
    with pytest.raises(UsageError, match="NAME=SIZE"):
        inputs.parse_dims(["N=zero"])


def test_npz_inputs_are_checked_against_the_model(tmp_path):
    m = _model(helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3]))
    good = tmp_path / "good.npz"
    np.savez(good, x=np.ones((5, 3), np.float32))
    assert inputs.load_npz(good, m)["x"].shape == (5, 3)
    for name, arrays, message in [
            ("shape", {"x": np.ones((5, 4), np.float32)}, "has shape 5x4, the model wants Nx3"),
            ("dtype", {"x": np.ones((5, 3), np.float64)}, "is float64, the model wants float32"),
            ("extra", {"x": np.ones((5, 3), np.float32), "z": np.ones(1)}, "'z' is not a model"),
            ("missing", {"w": np.ones(1)}, "'w' is not a model input")]:
        path = tmp_path / f"{name}.npz"
        np.savez(path, **arrays)
        with pytest.raises(UsageError, match=message):
            inputs.load_npz(path, m)
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(UsageError, match="not a NumPy .npz file") as err:
        inputs.load_npz(tmp_path / "bad.npz", m)
    assert "unsafely" not in str(err.value) and "pickle" not in str(err.value), err.value
