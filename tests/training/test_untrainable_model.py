"""A workload whose model no trainer can train is an input error: `d500 train` (level 2, and level 3
under mpiexec), `d500 tune` and the tuning `d500 run` starts refuse it with one line naming the
workload file and its model, exit 2, before any ledger run or study opens. The input: an opset-7
ONNX file with BatchNormalization-7 spatial=0 (onnx's version converter cannot bring it to the
opset whose BatchNormalization trains) beside a workload YAML naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from d500 import builders
from d500.errors import ConfigError, ModelError
from d500.ledger import Ledger
from d500.training import submission, tuning, workloads
from d500.training.trainer import preflight, train
from tests.distributed import level3_jobs as jobs

ROOT = Path(__file__).resolve().parents[2]
SGD = ROOT / "submissions" / "sgd-momentum"
SYNC = ROOT / "submissions" / "sync"
NAME = "digits-bn7"
BN7_ERROR = ("model 'bn7' (opset 7) cannot train its BatchNormalization: training mode needs "
             "opset >= 14 and onnx's version converter cannot convert the model to opset 15: "
             "Attribute spatial must have value 1")


def bn7_model(spatial: int) -> onnx.ModelProto:
    """An opset-7 digits classifier: BatchNormalization-7 on the 1x8x8 input (per element with
    spatial=0, per channel with spatial=1), Gemm to 10 logits, cross-entropy from opset-7 ops."""
    rng = np.random.default_rng(0)
    stats = (1, 8, 8) if spatial == 0 else (1,)
    inits = [numpy_helper.from_array(np.ones(stats, np.float32), "scale"),
             numpy_helper.from_array(np.zeros(stats, np.float32), "shift"),
             numpy_helper.from_array(np.zeros(stats, np.float32), "mean"),
             numpy_helper.from_array(np.ones(stats, np.float32), "var"),
             numpy_helper.from_array(rng.standard_normal((64, 10)).astype(np.float32) * 0.1,
                                     "w"),
             numpy_helper.from_array(np.zeros(10, np.float32), "b"),
             numpy_helper.from_array(np.array([-1, 64], np.int64), "flat"),
             numpy_helper.from_array(np.arange(10, dtype=np.int64).reshape(1, 10), "classes")]
    nodes = [
        helper.make_node("BatchNormalization", ["input", "scale", "shift", "mean", "var"],
                         ["bn"], spatial=spatial),
        helper.make_node("Reshape", ["bn", "flat"], ["features"]),
        helper.make_node("Gemm", ["features", "w", "b"], ["logits"]),
        helper.make_node("LogSoftmax", ["logits"], ["logp"], axis=1),
        helper.make_node("Unsqueeze", ["labels"], ["column"], axes=[1]),
        helper.make_node("Equal", ["column", "classes"], ["hit"]),
        helper.make_node("Cast", ["hit"], ["onehot"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["onehot", "logp"], ["picked"]),
        helper.make_node("ReduceSum", ["picked"], ["per_sample"], axes=[1], keepdims=0),
        helper.make_node("ReduceMean", ["per_sample"], ["mean_logp"], keepdims=0),
        helper.make_node("Neg", ["mean_logp"], ["loss"]),
    ]
    graph = helper.make_graph(
        nodes, "bn7",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 1, 8, 8]),
         helper.make_tensor_value_info("labels", TensorProto.INT64, ["N"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10]),
         helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 7)])
    onnx.checker.check_model(model, full_check=True)
    return model


def write_workload(folder: Path, model: onnx.ModelProto | None, level: int = 2,
                   **model_field: object) -> Path:
    """A workload file in `folder` naming `model` (saved beside it as model.onnx) or, with
    `model` None, the given `model:` mapping; level 3 at 1 or 2 ranks."""
    folder.mkdir(parents=True, exist_ok=True)
    if model is not None:
        onnx.save(model, folder / "model.onnx")
        model_field = {"file": "model.onnx"}
    data = {"name": NAME, "level": level, "description": "a user's model on the digits",
            "model": model_field,
            "dataset": {"name": "digits", "train": 1197, "validation": 300, "test": 300},
            "batch_size": {"min": 8, "max": 256}, "evaluation": {"every_epochs": 1},
            "target": {"metric": "val_accuracy", "value": 0.9},
            "budget": {"max_epochs": 2, "max_seconds": 120}, "seeds": 1,
            "metrics": ["time_to_accuracy", "val_accuracy"], "rank_by": "time_to_accuracy"}
    if level == 2:
        data["tuning"] = {"studies": 1, "trials": 2, "seed": 0}
    else:
        data["distributed"] = {"ranks": [1, 2], "batch": "global"}
    path = folder / f"{NAME}-{level}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def write_entry(folder: Path, source: Path = SGD) -> Path:
    """A copy of an example entry that enters the test's workload."""
    data = yaml.safe_load((source / "submission.yaml").read_text())
    data["workloads"] = [NAME]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "submission.yaml").write_text(yaml.safe_dump(data))
    return folder


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    return tmp_path / "home"


def d500(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "D500_HOME": str(home), "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("D500_DATA", None)
    return subprocess.run([sys.executable, "-m", "d500.cli", *args], capture_output=True,
                          text=True, timeout=600, cwd=ROOT, env=env, check=False)


def nothing_recorded(home: Path) -> bool:
    path = home / "ledger.sqlite"
    if not path.exists():
        return True
    ledger = Ledger(path)
    return ledger.runs() == [] and ledger.studies() == []


def one_line(result: subprocess.CompletedProcess, command: str, message: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith(f"d500 {command}: error: ") and message in lines[0], lines[0]


@pytest.mark.parametrize("command", ["train", "tune"])
def test_a_bn7_spatial0_model_is_one_line_exit_2_and_nothing_recorded(home, tmp_path, command):
    path = write_workload(tmp_path / "wl", bn7_model(spatial=0))
    entry = write_entry(tmp_path / "entry")
    result = d500(home, command, str(path), "--submission", str(entry))
    one_line(result, command, f"{path}: field 'model.file' (model.onnx): {BN7_ERROR}")
    assert result.stdout.strip() == ""
    assert nothing_recorded(home)


def test_the_same_model_with_a_convertible_batch_norm_trains(home, tmp_path):
    """The control: BatchNormalization-7 with spatial=1 converts, so the run opens and trains
    (the model built by the pre-flight is the one the run trains)."""
    path = write_workload(tmp_path / "wl", bn7_model(spatial=1))
    entry = write_entry(tmp_path / "entry")
    result = d500(home, "train", str(path), "--submission", str(entry), "--backend",
                  "reference", "--json")
    assert result.returncode in (0, 1), result.stderr
    runs = Ledger(home / "ledger.sqlite").runs()
    assert [r["status"] for r in runs] in (["succeeded"], ["missed"]), runs
    assert Ledger(home / "ledger.sqlite").evaluations(runs[0]["id"])


def test_the_tuning_of_d500_run_opens_no_study_for_it(home, tmp_path):
    """`d500 run`'s level-2 stage calls tuning.tune directly: the error comes before any study
    is opened (the runner reports it as a problem line)."""
    wl = workloads.load(write_workload(tmp_path / "wl", bn7_model(spatial=0)))
    entry = submission.load(write_entry(tmp_path / "entry"))
    ledger = Ledger()
    with pytest.raises(ModelError, match="cannot train its BatchNormalization"):
        tuning.tune(wl, entry, "reference", studies=1, trials=2, ledger=ledger)
    assert ledger.studies() == [] and ledger.runs() == []


def _renamed_output(model: onnx.ModelProto, old: str, new: str) -> onnx.ModelProto:
    for node in model.graph.node:
        node.output[:] = [new if o == old else o for o in node.output]
    for out in model.graph.output:
        if out.name == old:
            out.name = new
    return model


def _no_parameters() -> onnx.ModelProto:
    """Logits sliced from the input itself: a model with nothing to train."""
    inits = [numpy_helper.from_array(np.array([0], np.int64), "start"),
             numpy_helper.from_array(np.array([10], np.int64), "end"),
             numpy_helper.from_array(np.array([1], np.int64), "axis")]
    nodes = [helper.make_node("Flatten", ["input"], ["flat"], axis=1),
             helper.make_node("Slice", ["flat", "start", "end", "axis"], ["logits"]),
             helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["loss"])]
    graph = helper.make_graph(
        nodes, "sliced",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 1, 8, 8]),
         helper.make_tensor_value_info("labels", TensorProto.INT64, ["N"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10]),
         helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("make, message", [
    (lambda: _renamed_output(builders.build("mlp", (1, 8, 8), loss=True), "loss", "cost"),
     ("model 'mlp' has no output 'loss' (a training model has inputs input, labels and "
      "outputs logits, loss; its outputs: logits, cost)")),
    (lambda: builders.build("mlp", (1, 8, 8), loss=False),
     ("model 'mlp' has no input 'labels' (a training model has inputs input, labels and "
      "outputs logits, loss; its inputs: input)")),
    (lambda: builders.build("lenet5", (1, 28, 28), loss=True),
     ("model 'lenet5' takes input 'input' of shape (?, 1, 28, 28); the dataset's batches "
      "are (N, 1, 8, 8)")),
    (_no_parameters, "model 'sliced' has no float parameters (initializers) to train"),
], ids=["no-loss-output", "no-labels-input", "input-shape", "no-parameters"])
def test_a_model_without_what_trainers_need_is_refused_before_the_run(home, tmp_path, make,
                                                                     message):
    path = write_workload(tmp_path / "wl", make())
    wl = workloads.load(path)
    entry = submission.load(write_entry(tmp_path / "entry"))
    with pytest.raises(ModelError) as caught:
        preflight(wl, entry.recipe, "reference", None)
    assert str(caught.value) == f"{path}: field 'model.file' (model.onnx): {message}"
    ledger = Ledger()
    with pytest.raises(ModelError):
        train(wl, entry.recipe, "reference", 0, ledger=ledger, submission=entry.name)
    assert ledger.runs() == []


def test_a_builder_that_does_not_fit_the_dataset_is_refused_before_the_run(home, tmp_path):
    path = write_workload(tmp_path / "wl", None, builder="lenet5", input_shape=[1, 28, 28])
    wl = workloads.load(path)
    entry = submission.load(write_entry(tmp_path / "entry"))
    ledger = Ledger()
    with pytest.raises(ConfigError, match=r"field 'model.input_shape' is \[1, 28, 28\] but the "
                                          r"dataset 'digits' has \[1, 8, 8\]"):
        train(wl, entry.recipe, "reference", 0, ledger=ledger, submission=entry.name)
    assert ledger.runs() == []


@pytest.mark.mpi
@pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")
def test_level_3_refuses_it_on_every_rank_before_the_run(tmp_path):
    home = tmp_path / "home"
    path = write_workload(tmp_path / "wl", bn7_model(spatial=0), level=3)
    entry = write_entry(tmp_path / "entry", SYNC)
    result = jobs.train(home, 2, path, entry, timeout=240)
    assert result.returncode == 2, result.stderr
    message = f"d500 train: error: {path}: field 'model.file' (model.onnx): {BN7_ERROR}"
    # one whole line per rank, named by its rank (hydra forwards them in any order)
    assert result.stderr.count(message) == 2, result.stderr
    assert result.stderr.count("d500 train: error: ") == 2, result.stderr
    assert sorted(line[:9] for line in result.stderr.splitlines()) == ["[rank 0] ", "[rank 1] "]
    assert "Traceback" not in result.stderr and result.stdout.strip() == ""
    assert nothing_recorded(home)
