"""`d500 net check`: every backend agrees on the d500 builders and the onnx package's networks; a
wrong backend, a missing operator and a bad model are each reported as such; each backend's run is
recorded as soon as it is judged, so a killed check keeps the finished ones."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from d500 import backends
from d500.networks import inputs
from d500.networks.check import check
from d500.networks.workloads import onnx_package_file

from .conftest import d500, save_builder

ALL = ["reference", "torch", "tensorflow", "onnxruntime"]


@pytest.mark.slow
@pytest.mark.parametrize("name, shape", [("mlp", (1, 8, 8)), ("lenet5", (1, 28, 28)),
                                         ("resnet20", (3, 32, 32))])
def test_builders_agree_on_all_four_backends_logits_and_loss(name, shape):
    from d500 import builders
    model = builders.build(name, shape, loss=True)
    report = check(model, inputs.make(model, seed=1), ALL, model_name=name, seed=1)
    assert report.baseline == "reference" and report.baseline_kind == "reference"
    assert [r.backend for r in report.results] == ALL
    for r in report.results:
        assert r.status == "ok", r.error
        assert [c.output for c in r.comparisons] == ["logits", "loss"]
        assert r.agrees and r.max_rel < 1e-4, (r.backend, r.max_rel)
    assert report.exit_code == 0


@pytest.mark.slow
@pytest.mark.parametrize("light", ["light_squeezenet.onnx", "light_densenet121.onnx"])
def test_light_networks_from_the_onnx_package_agree(light):
    # squeezenet: Softmax before opset 13 flattens to 2-D; densenet: a one-output opset-9
    # BatchNormalization is inference. onnx's ReferenceEvaluator got both wrong.
    model = onnx.load(onnx_package_file(light))
    report = check(model, inputs.make(model, seed=0), ALL, model_name=light)
    assert report.exit_code == 0, report.as_dict()
    assert all(r.agrees for r in report.results)


# -- a backend with a bug, and a reference that cannot run the model (see conftest) ---------

def test_a_backend_off_by_one_percent_is_caught(extra_backends, tmp_path, home, capsys):
    from d500.cli import main
    from d500.ledger import Ledger
    path = save_builder(tmp_path, "mlp", (1, 8, 8))
    code = main(["net", "check", str(path), "--backends", "onnxruntime,perturbed", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and report["exit_code"] == 1
    verdicts = {b["backend"]: b["verdict"] for b in report["backends"]}
    assert verdicts == {"reference": "agrees", "onnxruntime": "agrees",
                        "perturbed": "DISAGREES"}
    bad = next(b for b in report["backends"] if b["backend"] == "perturbed")
    assert abs(bad["max_rel"] - 0.01) < 1e-3
    runs = {r["backend"]: r for r in Ledger().runs(level=1)}
    assert set(runs) == {"onnxruntime", "perturbed"}
    assert runs["onnxruntime"]["status"] == "succeeded"
    assert runs["perturbed"]["status"] == "failed" and "disagrees" in runs["perturbed"]["error"]
    assert runs["perturbed"]["figures"]["agreement"] == pytest.approx(0.01, rel=0.1)


def test_without_the_reference_the_majority_is_the_baseline(extra_backends, monkeypatch):
    from d500 import builders
    monkeypatch.setitem(backends.BUILTIN, "reference", f"{extra_backends.__name__}:NoReference")
    model = builders.build("mlp", (1, 8, 8))
    feeds = inputs.make(model, seed=0)
    # torch's and onnxruntime's answers outvote the perturbed one, whatever the order
    report = check(model, feeds, ["perturbed", "onnxruntime", "torch"])
    assert report.baseline_kind == "majority" and report.baseline in ("onnxruntime", "torch")
    assert {r.backend: r.verdict for r in report.checked} == {
        "perturbed": "DISAGREES", "onnxruntime": "agrees", "torch": "agrees"}
    assert report.exit_code == 1 and "could not run the model" in report.note
    report = check(model, feeds, ["onnxruntime", "torch"])
    assert report.exit_code == 0  # the reference was only the baseline, not a checked backend
    report = check(model, feeds, ["reference", "onnxruntime"])
    assert report.exit_code == 2 and report.first_unsupported().backend == "reference"
    report = check(model, feeds, ["onnxruntime"])  # alone, it agrees with nobody
    assert report.exit_code == 1 and report.baseline is None
    assert "nothing to compare it with" in report.note


# -- bad input from the command line ----------------------------------------------------------

def test_bad_models_are_one_line_and_exit_2(tmp_path, home):
    good = save_builder(tmp_path, "mlp", (1, 8, 8))
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(good.read_bytes()[:200])
    node = helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example", name="frob1")
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    custom = tmp_path / "custom.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.example", 1)]),
              custom)
    misfit = tmp_path / "misfit.onnx"  # a 2x3 by a 2x3: no backend is to blame
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3])
                               for n in ("a", "b")],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), misfit)
    cases = [
        ([misfit], (f"{misfit}: node 'mm' (MatMul) cannot take input shapes a 2x3, b 2x3: "
                   f"Incompatible dimensions for matrix multiplication")),
        ([truncated], "not an ONNX model or truncated"),
        ([tmp_path / "missing.onnx"], "no such file"),
        (["mlp-mnist"], "'mlp-mnist' is a level-1 workload: `d500 net bench mlp-mnist`"),
        ([custom, "--backends", "reference,onnxruntime"],
         ("backend 'reference' does not support operator com.example::Frobnicate (opset 1) "
         "used by node 'frob1'")),
        ([good, "--backends", "nosuch"], "unknown backend 'nosuch'"),
        ([good, "--inputs", tmp_path / "missing.npz"], "no such inputs file"),
        ([good, "--inputs", tmp_path], f"{tmp_path}: a folder, where an inputs file (.npz) goes"),
        ([good, "--dim", "M=3"], "no input dimension named 'M'"),
    ]
    for args, message in cases:
        result = d500("net", "check", *args, home=home)
        assert result.returncode == 2, (args, result.stderr)
        last = result.stderr.strip().splitlines()[-1]
        assert message in last and "Traceback" not in result.stderr, (args, result.stderr)


def test_cli_table_and_inputs_file(tmp_path, home):
    model = save_builder(tmp_path, "mlp", (1, 8, 8))
    feeds = tmp_path / "inputs.npz"
    np.savez(feeds, input=np.ones((3, 1, 8, 8), np.float32))
    result = d500("net", "check", model, "--backends", "onnxruntime", "--inputs", feeds,
                  home=home)
    assert result.returncode == 0, result.stderr
    assert "onnxruntime" in result.stdout and "agrees" in result.stdout
    assert "input 3x1x8x8, from --inputs" in result.stdout
    assert "all backends agree" in result.stdout


# -- net check records as it goes --------------------------------------------------------------

def test_each_backend_is_sealed_as_soon_as_it_is_judged(tmp_path, home):
    from d500 import builders
    from d500.ledger import Ledger
    from d500.networks.check import Recorder
    path = save_builder(tmp_path, "mlp", (1, 8, 8))
    model = builders.build("mlp", (1, 8, 8))
    ledger = Ledger()
    seen: dict[str, dict[str, str]] = {}

    def progress(backend: str) -> None:  # called before each backend runs
        seen[backend] = {r["backend"]: r["status"] for r in ledger.runs(level=1)}

    report = check(model, inputs.make(model, seed=0), ["onnxruntime", "torch"], seed=0,
                   progress=progress, recorder=Recorder(path, ledger))
    assert report.exit_code == 0
    assert seen["reference"] == {"onnxruntime": "running", "torch": "running"}
    assert seen["torch"] == {"onnxruntime": "succeeded", "torch": "running"}
    runs = ledger.runs(level=1)
    assert [(r["backend"], r["status"], r["workload"]) for r in runs] == [
        ("onnxruntime", "succeeded", "check:mlp"), ("torch", "succeeded", "check:mlp")]
    assert all(r["details"]["verdict"] == "agrees" and r["figures"]["agreement"] < 1e-4
               for r in runs)
    assert ledger.verify() == []


@pytest.mark.slow
def test_a_killed_net_check_keeps_the_finished_backends(tmp_path, home):
    import os
    import signal
    import sqlite3
    import subprocess
    import sys
    import time

    from d500.ledger import Ledger

    from .conftest import ROOT
    path = save_builder(tmp_path, "resnet20", (3, 32, 32))
    env = {**os.environ, "D500_HOME": str(home), "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.Popen([sys.executable, "-m", "d500.cli", "net", "check", str(path),
                             "--backends", "onnxruntime,torch,tensorflow"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    db_path, finished, deadline = home / "ledger.sqlite", 0, time.monotonic() + 300
    try:
        while finished < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
            try:
                with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=30) as db:
                    finished = db.execute("SELECT COUNT(*) FROM runs WHERE status != 'running'"
                                          ).fetchone()[0]
            except sqlite3.OperationalError:  # not created yet
                continue
        assert proc.poll() is None, "net check ended before two backends were recorded"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    ledger = Ledger()
    runs = {r["backend"]: r for r in ledger.runs(level=1)}
    assert set(runs) == {"onnxruntime", "torch", "tensorflow"}
    assert runs["onnxruntime"]["status"] == runs["torch"]["status"] == "succeeded"
    assert runs["onnxruntime"]["details"]["verdict"] == "agrees"
    assert runs["tensorflow"]["status"] == "interrupted"
    assert ledger.verify() == []


def test_without_the_reference_runs_are_sealed_once_the_majority_decides(extra_backends,
                                                                         monkeypatch, tmp_path):
    from d500 import builders
    from d500.ledger import Ledger
    from d500.networks.check import Recorder
    monkeypatch.setitem(backends.BUILTIN, "reference", f"{extra_backends.__name__}:NoReference")
    path = save_builder(tmp_path, "mlp", (1, 8, 8))
    model = builders.build("mlp", (1, 8, 8))
    ledger = Ledger()
    seen: dict[str, dict[str, str]] = {}
    report = check(model, inputs.make(model, seed=0),
                   ["reference", "perturbed", "onnxruntime", "torch"], seed=0,
                   progress=lambda b: seen.setdefault(b, {
                       r["backend"]: r["status"] for r in ledger.runs(level=1)}),
                   recorder=Recorder(path, ledger))
    assert report.baseline_kind == "majority" and report.exit_code == 2
    assert set(seen["torch"].values()) == {"running"}  # no verdict before the majority
    runs = {r["backend"]: r for r in ledger.runs(level=1)}
    assert runs["reference"]["status"] == "failed"
    assert "does not support" in runs["reference"]["error"]
    assert runs["perturbed"]["status"] == "failed"
    assert runs[report.baseline]["details"]["verdict"] == "baseline (majority)"
    other = ({"onnxruntime", "torch"} - {report.baseline}).pop()
    assert runs[other]["status"] == "succeeded" and runs[other]["details"]["verdict"] == "agrees"
    assert ledger.verify() == []
