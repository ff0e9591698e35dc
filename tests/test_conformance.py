"""`d500 conformance`: per-operator results, totals, JSON, and one-line errors for bad names."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from d500.conformance import _op_of, node_tests
from tests.helpers import seed_node_tests


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """Every invocation records a ledger run: into a fresh D500_HOME per test."""
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def d500(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "d500.cli", *args], capture_output=True,
                          text=True, timeout=600, check=False)


@pytest.fixture(scope="module")
def tests_by_op() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for t in node_tests():
        found.setdefault(_op_of(t), []).append(t.name)
    return found


def test_suite_leaves_out_only_the_random_output_tests(tests_by_op):
    names = [n for names in tests_by_op.values() for n in names]
    assert len(names) == 1872
    assert not any(n.startswith(("test_bernoulli", "test_training_dropout")) for n in names)


def test_tests_are_attributed_to_the_operator_they_exercise(tests_by_op):
    assert "test_softmax_axis_0_expanded" in tests_by_op["Softmax"]  # not Exp
    assert "test_less_equal" in tests_by_op["LessOrEqual"]
    assert "test_sce_mean_expanded" in tests_by_op["SoftmaxCrossEntropyLoss"]
    assert "test_clip_default_inbounds_expanded" in tests_by_op["Clip"]
    assert "test_relu" in tests_by_op["Relu"]


def test_json_for_some_operators(tests_by_op):
    out = d500("conformance", "--backend", "reference", "--op", "Relu", "softmax", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["backend"] == "reference"
    expected = sorted(tests_by_op["Relu"] + tests_by_op["Softmax"])
    assert sorted(t["test"] for t in report["tests"]) == expected
    assert report["totals"] == {"pass": len(expected)}
    assert {t["op"] for t in report["tests"]} == {"Relu", "Softmax"}
    assert set(report) == {"backend", "totals", "tests"}  # the JSON stays what it was
    building, recorded = out.stderr.strip().splitlines()  # a fresh D500_HOME: built once
    assert building.startswith("building onnx ") and "node tests (once; cached in " in building
    assert recorded == ("recorded as ledger run 1 (partial: an --op run never counts as the "
                        "backend's conformance)")


def test_table_and_totals_line_count_failures_and_unsupported(tests_by_op, capsys, home):
    from d500.conformance import main
    seed_node_tests(home)
    # onnxruntime has no kernel for ImageDecoder.
    assert main(["--backend", "onnxruntime", "--op", "Relu", "ImageDecoder", "--failures"],
                prog="d500 conformance") == 0
    out = capsys.readouterr().out
    relu, decoder = len(tests_by_op["Relu"]), len(tests_by_op["ImageDecoder"])
    total = out.strip().splitlines()[-1]
    assert total.startswith(f"total: {relu + decoder} tests, {relu} pass, 0 fail, "
                            f"{decoder} unsupported"), total
    assert "12 random-output tests left out" in total
    assert "unsupported test_image_decoder" in out
    row = next(line for line in out.splitlines() if "ImageDecoder" in line and "│" in line)
    assert row.split("│")[-2].strip() == str(decoder)  # the "unsupported" column


@pytest.mark.parametrize(("args", "words"), [
    (("--backend", "nosuch"), ["unknown backend 'nosuch'", "reference"]),
    (("--backend", "reference", "--op", "Relu", "NoSuchOp"), ["NoSuchOp", "not ONNX operators"]),
    (("--backend", "reference", "--op", "Rleu"), ["Rleu", "(did you mean 'Relu'?)"]),
    (("--backend", "reference", "--op", "conv2d"), ["conv2d", "(did you mean 'Conv'?)"]),
    (("--backend", "reference", "--op", "Relu,Cnov"),  # a comma list: 'Relu,Cnov' was unknown
     ["unknown operator(s) Cnov:", "(did you mean 'Conv'?)"]),
    (("--backend", "reference", "--op", ","), ["--op names no operator"]),
    (("--backend", "reference", "--frobnicate"), ["--frobnicate"]),
    (("--backend", "reference", "--jobs", "0"), ["--jobs", "expected an integer >= 1, got '0'"]),
    ((), ["--backend"]),
])
def test_bad_usage_is_one_line_exit_2(args, words):
    out = d500("conformance", *args)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("d500 conformance: error:")
    assert all(w in out.stderr for w in words), out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_worker_processes_give_the_same_outcomes_in_the_same_order(tests_by_op, home):
    """--jobs spreads the tests over spawned workers (each reads the cached node tests): the
    outcomes, failures included, are those of one process, in the tests' order."""
    from d500.conformance import run_suite, select
    seed_node_tests(home)
    tests = select(["Relu", "ImageDecoder", "Gather", "Pad"])
    alone = run_suite("onnxruntime", tests=tests, progress=False)
    spread = run_suite("onnxruntime", tests=tests, progress=False, jobs=2)
    assert spread == alone
    assert {o.status for o in alone} >= {"pass", "unsupported"}


def test_a_lower_precision_mode_is_judged_at_its_dtype_and_no_looser():
    """openvino:bf16 computes in bfloat16 where the CPU can: each float output is judged at the
    looser of its test's tolerance and bfloat16's (rtol 2^-5, atol 2^-6 of the output's scale),
    never looser; a wrong value (a missing bias: O(1) of the scale) still fails, and every other
    mode keeps BackendTest's own judgement."""
    import numpy as np

    from d500 import backends, tolerances
    from d500.conformance import _harness
    want = np.linspace(-4, 4, 64, dtype=np.float32).reshape(8, 8)
    close = want * np.float32(1 + 2 ** -7)  # bfloat16's rounding of every element, twice over
    for precision, judged in ((None, False), ("bfloat16", True)):
        try:
            _harness(precision).assert_similar_outputs([want], [close], rtol=1e-3, atol=1e-7)
            passed = True
        except AssertionError:
            passed = False
        assert passed is judged, precision
    for wrong in (want + 0.25, want[::-1], want * 1.1):  # a missing bias, swapped, scaled
        with pytest.raises(AssertionError):
            _harness("bfloat16").assert_similar_outputs([want], [wrong], rtol=1e-3, atol=1e-7)
    assert tolerances.node_test(1e-3, 1e-7, want, "bfloat16") == (2 ** -5, 2 ** -6 * 4)
    assert tolerances.node_test(1e-3, 1e-7, want, None) == (1e-3, 1e-7)
    assert tolerances.node_test(0, 0, np.arange(4), "bfloat16") == (0, 0)  # integers: exact
    assert tolerances.node_test(0.1, 1.0, want, "bfloat16") == (0.1, 1.0)  # never tighter
    assert backends.get("openvino").precision() is None
    assert backends.get("openvino:bf16").precision() == "bfloat16"
    assert {backends.get(n).precision() for n in ("reference", "onnxruntime:basic")} == {None}


@pytest.mark.slow
def test_openvino_bf16_passes_what_only_float32_rounding_fails(home):
    """Tests whose error lies between float32's tolerance and bfloat16's (DFT; this CPU runs
    the mode in f32) fail on openvino and pass on openvino:bf16 in `d500 conformance`, whose run
    records what it was judged at (the node suite, tests/backends/test_node_suite.py, judges the
    mode so in BackendTest's own harness)."""
    pytest.importorskip("openvino")
    from d500.conformance import run_suite
    from d500.conformance_runs import record
    from d500.ledger import Ledger
    seed_node_tests(home)
    tests = [t for t in node_tests() if t.name.startswith("test_dft")]
    f32 = {o.test: o.status for o in run_suite("openvino", tests=tests, progress=False)}
    outcomes, run_id = record("openvino:bf16", ["DFT"], tests=tests, progress=False)
    bf16 = {o.test: o.status for o in outcomes}
    for name in ("test_dft", "test_dft_inverse", "test_dft_opset19"):
        assert (f32[name], bf16[name]) == ("fail", "pass"), name
    assert bf16["test_dft_rfft"] == "fail"  # what OpenVINO gets wrong at any precision
    assert [t for t, s in bf16.items() if s == "pass"] == [
        t for t, s in f32.items() if s == "pass" or t in ("test_dft", "test_dft_inverse",
                                                          "test_dft_opset19",
                                                          "test_dft_axis_opset19",
                                                          "test_dft_inverse_opset19")]
    [run] = Ledger().runs_by_id([run_id])
    assert run["backend"] == "openvino:bf16" and run["details"]["judged_at"] == "bfloat16"


def test_node_tests_are_built_once_per_onnx_version_and_read_back(home, monkeypatch, capsys):
    """Building them runs onnx's reference implementations (30-80 s here, for one operator as
    for all); the cache under D500_HOME is read instead, and one that does not read is built
    again (here from three real tests, so that the test stays fast)."""
    import dataclasses
    import importlib
    import pickle

    import onnx
    import onnx.backend.test.loader as loader

    from d500 import paths
    for op in ("abs", "relu"):  # onnx builds an operator's node tests as its module is imported
        importlib.import_module(f"onnx.backend.test.case.node.{op}")
    from onnx.backend.test.case.node import _NodeTestCases
    real = [t for t in _NodeTestCases if t.name in ("test_abs", "test_relu")]
    assert len(real) == 2
    random_output = dataclasses.replace(real[0], name="test_bernoulli_seed")
    path = paths.cache("onnx") / f"node-tests-{onnx.__version__}.pickle"
    path.write_bytes(pickle.dumps(real))
    monkeypatch.setattr(loader, "load_model_tests", None)  # not called: the cache is read
    assert [t.name for t in node_tests()] == [t.name for t in real]
    path.write_bytes(b"truncated")
    monkeypatch.setattr(loader, "load_model_tests",
                        lambda kind: [*real, random_output] if kind == "node" else [])
    capsys.readouterr()
    assert [t.name for t in node_tests()] == [t.name for t in real]  # built again, filtered
    assert f"node tests (once; cached in {path.parent})" in capsys.readouterr().err
    assert [t.name for t in pickle.loads(path.read_bytes())] == [t.name for t in real]
