"""`d500 conformance`: per-operator results, totals, JSON, and one-line errors for bad names."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from d500.conformance import _op_of, node_tests


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
    assert out.stderr.strip() == ("recorded as ledger run 1 (partial: an --op run never counts "
                                  "as the backend's conformance)")


def test_table_and_totals_line_count_failures_and_unsupported(tests_by_op, capsys):
    from d500.conformance import main
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
    (("--backend", "reference", "--frobnicate"), ["--frobnicate"]),
    ((), ["--backend"]),
])
def test_bad_usage_is_one_line_exit_2(args, words):
    out = d500("conformance", *args)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("d500 conformance: error:")
    assert all(w in out.stderr for w in words), out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
