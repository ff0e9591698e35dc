"""Level-1 workload files: the shipped ones load; each mistake is a ConfigError naming the field."""

from __future__ import annotations

import shutil
import tempfile
import textwrap
from pathlib import Path

import onnx
import pytest

from d500.builders import build
from d500.errors import ConfigError
from d500.networks import workloads

from .conftest import LEVEL1, d500

GOOD = """\
name: tiny
level: 1
model:
  builder: mlp
  input_shape: [1, 8, 8]
batch_size: 4
train: true
metrics: [train_step_time, latency]
"""


def test_every_shipped_workload_loads_and_the_light_models_resolve_in_the_onnx_package():
    files = workloads.all_files()
    loaded = [workloads.load(p) for p in files]
    names = [w.name for w in loaded]
    assert len(set(names)) == len(names) == 14
    light = [w for w in loaded if w.model.get("onnx_package")]
    assert sorted(w.model["onnx_package"] for w in light) == workloads.onnx_package_models()
    assert len(light) == 9 and not any(w.train for w in light)
    trained = sorted(w.model["builder"] for w in loaded if w.train)
    assert trained == ["lenet5", "mlp", "resnet20", "transformer"]
    for w in light:
        path = workloads.onnx_package_file(w.model["onnx_package"])
        assert path.is_file() and path.parent == workloads.light_folder()
    assert workloads.find("light-resnet50") == LEVEL1 / "light-resnet50.yaml"


def _write(tmp_path: Path, text: str, name: str = "w.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize("change, message", [
    (("batch_size: 4", "batch_size: 4\ncolour: red"), "unknown field 'colour'"),
    (("batch_size: 4", "bach_size: 4"), r"unknown field 'bach_size' \(allowed: .*; did you mean "
                                        r"'batch_size'\?\)$"),
    (("batch_size: 4", "batch_size: four"), "field 'batch_size' must be an integer"),
    (("batch_size: 4", "batch_size: 4\nbatch_size: 8"),  # YAML keeps the last, silently
     r":\d+:1: invalid YAML: field 'batch_size' given twice \(first on line \d+\)$"),
    (("  builder: mlp", "  builder: mlp\n  builder: mlp"), "field 'builder' given twice"),
    (("train: true", "train: 1"), "field 'train' must be true or false"),
    (("  builder: mlp", "  builder: mlp\n  speed: 3"), "unknown field 'model.speed'"),
    (("  builder: mlp", "  builder: alexnet"), "field 'model.builder' is 'alexnet'"),
    (("  builder: mlp", "  builder: mlp\n  onnx_package: light_resnet50.onnx"),
     "needs exactly one of onnx_package, file, builder"),
    (("  input_shape: [1, 8, 8]", "  input_shape: [8, 8]"), "field 'model.input_shape'"),
    (("level: 1", "level: 0"), r"a level-0 file \(field 'level'\), where this command takes level"),
    (("metrics: [train_step_time, latency]", "metrics: [train_step_time, speed]"),
     "unknown metric 'speed'"),
    (("metrics: [train_step_time, latency]", "metrics: [train_step_time, latncy]"),
     r"unknown metric 'latncy' \(defined in metrics/: .*; did you mean 'latency'\?\)$"),
    (("metrics: [train_step_time, latency]", "metrics: [latency, gflops]"),
     "names 'gflops', which level 1 does not measure"),
    (("train: true", "train: false"), "names train_step_time but 'train' is false"),
    (("name: tiny\n", ""), "missing required field 'name'"),
    (("train: true", "train: true\nseed: -1"), "field 'seed' must be an integer >= 0"),
    (("  builder: mlp", "  builder: mlp\n  seed: -2"),
     "field 'model.seed' must be an integer >= 0"),
    (("train: true", "train: true\nbudget: .inf"), "field 'budget' must be a positive number"),
    (("metrics: [train_step_time, latency]", "metrics: [latency]\nrank_by: throughput"),
     "field 'rank_by' is 'throughput', not one of its metrics"),
])
def test_a_bad_workload_names_the_field(tmp_path, change, message):
    old, new = change
    assert old in GOOD
    path = _write(tmp_path, GOOD.replace(old, new))
    with pytest.raises(ConfigError, match=message) as err:
        workloads.load(path)
    assert str(path) in str(err.value)


def test_model_files_must_exist_and_stay_beside_the_workload(tmp_path):
    """A user's workload anywhere may name a model in its own folder; traversal out of it and
    absolute system paths are refused."""
    folder = tmp_path / "mine"
    (folder / "models").mkdir(parents=True)
    onnx.save(build("mlp", input_shape=(1, 8, 8), seed=0), folder / "models" / "m.onnx")

    def workload(value: str) -> Path:
        path = folder / "w.yaml"
        path.write_text(GOOD.replace("  builder: mlp\n  input_shape: [1, 8, 8]\n",
                                     f"  file: {value}\n").replace("train: true", "train: false")
                        .replace("[train_step_time, latency]", "[latency]"))
        return path

    assert workloads.load(workload("models/m.onnx")).model["file"] == folder / "models" / "m.onnx"
    for value, message in [("../../../../../../etc/passwd", "points outside"),
                           ("/etc/passwd", "points outside"),
                           ("no-such-model.onnx", "no such file no-such-model.onnx")]:
        with pytest.raises(ConfigError, match=message):
            workloads.load(workload(value))
    bad = _write(tmp_path, GOOD.replace("  builder: mlp\n  input_shape: [1, 8, 8]\n",
                                        "  onnx_package: ../light_resnet50.onnx\n"))
    with pytest.raises(ConfigError, match="not a model shipped in the onnx package"):
        workloads.load(bad)


def test_training_needs_a_loss(tmp_path):
    path = _write(tmp_path, GOOD.replace("  builder: mlp\n  input_shape: [1, 8, 8]\n",
                                         "  onnx_package: light_resnet50.onnx\n"))
    with pytest.raises(ConfigError, match="field 'train' is true but the model has no loss"):
        workloads.load(path)


def test_bad_workload_from_the_cli_is_one_line_and_exit_2(tmp_path, home):
    path = _write(tmp_path, GOOD.replace("batch_size: 4", "batch_size: [4]"))
    result = d500("net", "bench", path, home=home)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
    assert "field 'batch_size' must be an integer" in result.stderr
    yaml_error = _write(tmp_path, "name: [unclosed\n", "broken.yaml")
    result = d500("net", "bench", yaml_error, home=home)
    assert result.returncode == 2 and "invalid YAML" in result.stderr
    assert result.stderr.strip().count("\n") == 0
    result = d500("net", "bench", "no-such-workload", home=home)
    assert result.returncode == 2 and "no level-1 workload named 'no-such-workload'" in (
        result.stderr)


def test_a_workload_naming_a_truncated_model_is_one_line_and_exit_2(tmp_path, home):
    from .conftest import save_builder
    inside = Path(tempfile.mkdtemp(dir=Path(__file__).parent))  # model files stay in the project
    try:
        good = save_builder(tmp_path, "mlp", (1, 8, 8))
        (inside / "cut.onnx").write_bytes(good.read_bytes()[:300])
        path = inside / "w.yaml"
        path.write_text("name: cut\nlevel: 1\nmodel:\n  file: cut.onnx\nmetrics: [latency]\n")
        result = d500("net", "bench", path, "--backends", "onnxruntime", home=home)
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
        assert "cut.onnx: not an ONNX model or truncated" in result.stderr
    finally:
        shutil.rmtree(inside)
