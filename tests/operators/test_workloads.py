"""The level-0 cases: valid files covering the agreed operators, each accepted by the reference,
and each passed by a correct implementation (no false alarms at kinks, ties, broadcasts)."""

from __future__ import annotations

import pytest

from d500.errors import ConfigError
from d500.operators.validate import validate
from d500.operators.workloads import all_cases, cases_for, load_case, load_submission

from .conftest import ROOT, SUBMISSIONS, op

REQUIRED = {"Conv", "Gemm", "MatMul", "Relu", "Sigmoid", "Softmax", "MaxPool", "AveragePool",
            "BatchNormalization", "LayerNormalization", "Add"}


def test_cases_cover_the_agreed_operators_and_conv_variants():
    cases = all_cases()
    assert REQUIRED <= {c.op_type for c in cases}
    conv_attrs = set().union(*(c.attributes for c in cases_for("Conv")))
    assert {"strides", "pads", "group", "dilations"} <= conv_attrs
    assert any(c.shapes[0] != c.shapes[1] for c in cases_for("Add"))  # broadcasting
    assert len({c.name for c in cases}) == len(cases)
    assert all(c.metrics and c.path.parent.name == "0-operators" for c in cases)


def test_submissions_name_their_operator():
    for folder in ("numpy-im2col-conv", "torch-softmax", "c-gemm"):
        sub = load_submission(SUBMISSIONS / folder / "submission.yaml")
        assert sub["operator_file"].is_file() and sub["level"] == 0


def test_bad_case_files_name_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    base = "name: x\nlevel: 0\nmetrics: [latency]\noperator: Relu\n"
    bad.write_text(base + "inputs: [[2, -1]]\n")
    with pytest.raises(ConfigError, match="inputs\\[0\\]"):
        load_case(bad)
    bad.write_text(base + "inputs: [{shape: [2], low: 1}]\n")
    with pytest.raises(ConfigError, match="low and high"):
        load_case(bad)
    bad.write_text(base.replace("Relu", "Nope") + "inputs: [[2]]\n")
    with pytest.raises(ConfigError, match="'Nope' is not an ONNX operator"):
        load_case(bad)
    bad.write_text(base.replace("[latency]", "[latency, val_accuracy]") + "inputs: [[2]]\n")
    with pytest.raises(ConfigError, match="names 'val_accuracy', which level 0 does not measure"):
        load_case(bad)
    bad.write_text(base + "inputs: [[2]]\nrank_by: gflops\n")
    with pytest.raises(ConfigError, match="field 'rank_by' is 'gflops', not one of its metrics"):
        load_case(bad)
    # a mistyped name gets the closest (it said only that the name was wrong)
    bad.write_text(base.replace("Relu", "Rellu") + "inputs: [[2]]\n")
    with pytest.raises(ConfigError, match="'Rellu' is not an ONNX operator \\(did you mean "
                                          "'Relu'\\?\\)"):
        load_case(bad)
    bad.write_text(base + "inputs: [[2]]\nrank_by: latncy\n")
    with pytest.raises(ConfigError, match="not one of its metrics \\(latency; did you mean "
                                          "'latency'\\?\\)"):
        load_case(bad)
    bad.write_text(base + "inputs: [[2]]\ndtype: float33\n")
    with pytest.raises(ConfigError, match="'float33'; allowed: .*; did you mean 'float32'\\?"):
        load_case(bad)
    bad.write_text(base + "inputs: [[2]]\ntime_budget: -1\n")
    with pytest.raises(ConfigError, match="field 'time_budget' must be a positive number"):
        load_case(bad)


@pytest.mark.slow
@pytest.mark.parametrize("case", all_cases(ROOT / "levels" / "0-operators"), ids=lambda c: c.name)
def test_every_case_passes_a_correct_torch_implementation(case):
    report = validate(op("torch_ops.py", case.op_type), case)  # classes are named by op type
    assert report.passed, report.text()
    assert report.gradients_checked
