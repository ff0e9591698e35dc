"""`d500 net bench`: figures per backend recorded as ledger runs and shown by the level-1
leaderboard; failures recorded, not hidden."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from d500 import leaderboard
from d500.backends import get
from d500.errors import ConfigError
from d500.ledger import Ledger
from d500.networks import bench as nb
from d500.networks import workloads
from d500.networks.bench import bench
from tests.helpers import BENCH_METRICS, tiny_mlp

from .conftest import d500

TINY = tiny_mlp(train=True, metrics=BENCH_METRICS)
UNTRAINED = tiny_mlp(metrics=BENCH_METRICS[1:])  # no train step


def batch_one_workload(folder: Path, batch_size: int = 4) -> Path:
    """A level-1 workload file `batch-one.yaml` in `folder` and its model beside it:
    y = Reshape(x, [1, 8]) W, whose input batch is the symbolic N but whose graph fixes it to 1,
    so every backend runs it at batch 1 (first call, agreement, latency) and raises at
    `batch_size` (throughput)."""
    folder.mkdir(parents=True, exist_ok=True)
    w = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "one"], ["row"]),
         helper.make_node("MatMul", ["row", "w"], ["y"])], "batch-one",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(w, "w"),
         numpy_helper.from_array(np.array([1, 8], np.int64), "one")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              folder / "batch-one.onnx")
    path = folder / "batch-one.yaml"
    path.write_text(f"name: batch-one\nlevel: 1\nmodel:\n  file: batch-one.onnx\n"
                    f"batch_size: {batch_size}\nbudget: 0.05\n"
                    "metrics: [latency, throughput, agreement]\nrank_by: latency\n")
    return path


def _workload(tmp_path, text=TINY):
    path = tmp_path / "tiny.yaml"
    path.write_text(textwrap.dedent(text))
    return workloads.load(path)


def test_bench_records_each_backend_and_the_leaderboard_ranks_them(tmp_path, home):
    wl = _workload(tmp_path)
    result = bench(wl, ["reference", "onnxruntime"])
    assert result.exit_code == 0
    by = {r.backend: r for r in result.results}
    ref, ort = by["reference"], by["onnxruntime"]
    for r in (ref, ort):
        assert r.status == "succeeded", r.error
        for name in ("latency", "throughput", "translate_time", "first_call_time"):
            assert r.figures[name] > 0
        assert r.details["latency"]["repetitions"] >= 3
        assert r.details["throughput"]["batch_size"] == 16
    assert ref.figures["agreement"] == 0 and 0 <= ort.figures["agreement"] < 1e-5
    # the reference computes gradients; onnxruntime is inference-only and says so
    assert ref.figures["train_step_time"] > 0 and ref.details["train_gradients"] > 0
    assert "train_step_time" not in ort.figures
    assert "inference-only" in ort.details["train_step_note"]
    runs = {r["backend"]: r for r in Ledger().runs(level=1, workload="tiny-mlp")}
    assert set(runs) == {"reference", "onnxruntime"}
    for backend, run in runs.items():
        assert run["status"] == "succeeded" and run["figures"] == by[backend].figures
        assert run["hyperparameters"]["batch_size"] == 16
    text = leaderboard.render(level=1, workload="tiny-mlp", fmt="md")
    assert "tiny-mlp" in text and "reference" in text and "onnxruntime" in text
    lines = [line for line in text.splitlines() if line.startswith("| 1 ")]
    fastest = min(runs.values(), key=lambda r: r["figures"]["latency"])["backend"]
    assert len(lines) == 1 and f"| {fastest} |" in lines[0]


def test_a_fixed_batch_model_must_be_benchmarked_at_its_batch(tmp_path):
    wl = _workload(tmp_path, UNTRAINED.replace("  builder: mlp\n  input_shape: [1, 8, 8]\n",
                                               "  onnx_package: light_squeezenet.onnx\n"))
    with pytest.raises(ConfigError, match="'batch_size' is 16 but model input 'data_0' has a "
                                          "fixed leading"):
        bench(wl, ["onnxruntime"])


def test_cli_bench_prints_the_table_and_records(tmp_path, home):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    result = d500("net", "bench", path, "--backends", "onnxruntime", "--budget", "0.05",
                  home=home)
    assert result.returncode == 0, result.stderr
    assert "net bench tiny-mlp" in result.stdout and "onnxruntime" in result.stdout
    assert "recorded in the ledger" in result.stdout
    ranked = [line for line in result.stdout.splitlines() if line.startswith("ranked by ")]
    assert len(ranked) == 1 and ranked[0].endswith(  # whole in a pipe: rich broke it at 160
        "; ×N = N times worse than the best; recorded in the ledger (d500 leaderboard --level 1 "
        "--workload tiny-mlp)"), result.stdout
    listed = d500("ledger", "list", "--level", "1", "--json", home=home)
    import json
    runs = json.loads(listed.stdout)
    assert [(r["workload"], r["backend"], r["status"]) for r in runs] == [
        ("tiny-mlp", "onnxruntime", "succeeded")]
    board = d500("leaderboard", "--level", "1", home=home)
    assert board.returncode == 0 and "tiny-mlp" in board.stdout


def test_cli_bench_on_tensorflow_prints_none_of_its_cpp_log_lines(tmp_path, home):
    """Issue 22 item 8: as a new user runs it (no TF_CPP_MIN_LOG_LEVEL of their own), `net bench`
    keeps TensorFlow's absl / oneDNN / CPU-feature lines off stderr, as `net check` does."""
    pytest.importorskip("tensorflow")
    import os
    import subprocess
    import sys
    path = tmp_path / "tiny.yaml"
    path.write_text(tiny_mlp(metrics=["latency"], batch_size=2, budget=0.01))
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["D500_HOME"] = str(home)
    result = subprocess.run([sys.executable, "-m", "d500.cli", "net", "bench", str(path),
                             "--backends", "tensorflow", "--budget", "0.01", "--threads", "1"],
                            capture_output=True, text=True, timeout=300, env=env, check=False)
    assert result.returncode == 0, result.stderr
    assert "tensorflow" in result.stdout
    for chatter in ("absl", "oneDNN", "cpu_feature_guard", "AVX", "I0000", "W0000"):
        assert chatter not in result.stderr, result.stderr


def test_a_backend_that_disagrees_is_recorded_failed_with_its_figures_and_never_ranked(
        extra_backends, tmp_path, home):
    wl = _workload(tmp_path, UNTRAINED)
    result = bench(wl, ["onnxruntime", "perturbed"])
    assert result.exit_code == 1
    bad = next(r for r in result.results if r.backend == "perturbed")
    assert bad.status == "failed" and "disagree with the reference" in bad.error
    assert bad.figures["agreement"] == pytest.approx(0.01, rel=0.1)
    assert "latency" not in bad.figures  # a wrong backend is not timed
    runs = {r["backend"]: r for r in Ledger().runs(level=1, workload="tiny-mlp")}
    assert runs["perturbed"]["status"] == "failed"
    assert runs["onnxruntime"]["status"] == "succeeded"
    board = leaderboard.build(level=1, workload="tiny-mlp")[0]
    ranked = [e.backend for e in board.entries if e.rank is not None]
    assert ranked == ["onnxruntime"]


def test_a_backend_that_fails_only_at_batch_b_is_failed_there_timed_or_not(tmp_path, home):
    """The first call and the agreement at batch 1 pass; the throughput pass at batch 4 raises on
    both backends and fails them, with their batch-1 figures. The untimed steps `d500
    reproduce` runs (first_call, judge_agreement, run_passes) fail them the same way."""
    wl = workloads.load(batch_one_workload(tmp_path / "rules"))
    result = bench(wl, ["reference", "onnxruntime"])
    assert result.exit_code == 1
    by = {r.backend: r for r in result.results}
    for r in by.values():
        assert r.status == "failed" and r.unsupported is None
        assert r.figures["latency"] > 0 and "throughput" not in r.figures
        assert r.figures["agreement"] <= 1e-6 and r.details["agreement"][0]["ok"]
    assert by["reference"].error.startswith("ValueError: cannot reshape array of size 32 into "
                                            "shape (1,8)")
    assert "Reshape" in by["onnxruntime"].error and "{4,8}" in by["onnxruntime"].error
    runs = {r["backend"]: r for r in Ledger().runs(level=1, workload="batch-one")}
    assert {b: (r["status"], r["error"]) for b, r in runs.items()} == {
        b: ("failed", r.error) for b, r in by.items()}

    model, path = wl.onnx_model()
    feeds1, feeds_b = nb.bench_inputs(wl, model)
    assert feeds1["x"].shape == (1, 8) and feeds_b["x"].shape == (4, 8)
    passes = nb.inference_passes(wl, feeds1, feeds_b)
    assert [(figure, batch) for figure, batch, _ in passes] == [("latency", 1),
                                                                ("throughput", 4)]
    for name, timed in by.items():
        r = nb.BackendBench(name)
        outputs = nb.first_call(r, get(name), path, feeds1, timed=False)
        reference = None if name == "reference" else nb.reference_outputs(
            path, feeds1, lambda text: None, wl.name)
        assert nb.judge_agreement(r, outputs, reference, wl.metrics) is not None
        assert r.status == "running"  # it agrees at batch 1
        nb.run_passes(r, passes)
        assert (r.status, r.error) == ("failed", timed.error)
        assert r.figures == {"agreement": timed.figures["agreement"]}  # no time measured
