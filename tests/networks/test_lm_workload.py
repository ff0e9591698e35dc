"""The level-1 language-model workload (levels/1-networks/text-lm.yaml): the transformer built
with its context and vocabulary, seeded token ids and labels inside the vocabulary (found from the
graph: the embedding's rows, the loss's classes through its Reshape), image fields refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from d500.errors import ConfigError
from d500.networks import inputs, workloads

LM = Path(__file__).resolve().parents[2] / "levels" / "1-networks" / "text-lm.yaml"


def test_the_lm_workload_builds_the_transformer_with_tokens_inside_its_vocabulary():
    wl = workloads.load(LM)
    model, path = wl.onnx_model(loss=True)
    assert path.is_file() and wl.loss_output == "loss"
    feeds = inputs.make(model, wl.seed, batch=wl.batch_size)
    for name in ("input", "labels"):  # the whole vocabulary, not INT_HIGH's first 10 ids
        assert feeds[name].shape == (32, 64) and feeds[name].dtype == np.int64
        assert feeds[name].min() >= 0 and 900 < feeds[name].max() < 1024
    from d500 import backends
    loss = backends.get("torch").prepare(model).run(feeds)[1]
    assert float(loss) == pytest.approx(np.log(1024), abs=0.3)  # uniform at initialisation


@pytest.mark.parametrize("change, field", [
    ({"input_shape": [1, 8, 8]}, "model.input_shape"),
    ({"vocab": None}, "model.vocab"),
])
def test_a_language_model_workload_with_a_wrong_field_is_refused_by_name(tmp_path, change, field):
    data = yaml.safe_load(LM.read_text())
    data["model"] = {k: v for k, v in {**data["model"], **change}.items() if v is not None}
    path = tmp_path / "lm.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=f"{path}: field '{field}'"):
        workloads.load(path)


def test_an_image_builder_refuses_the_language_model_fields(tmp_path):
    data = yaml.safe_load((LM.parent / "mlp-mnist.yaml").read_text())
    data["model"]["vocab"] = 1024
    path = tmp_path / "mlp.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="field 'model.vocab' only applies"):
        workloads.load(path)
