"""d500.testing.assert_operator_matches_reference: the level-0 check inside a user's own tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from d500.operators.base import load_class
from d500.testing import assert_operator_matches_reference

ROOT = Path(__file__).resolve().parents[1]
CONV = load_class(ROOT / "submissions/numpy-im2col-conv/conv.py", "Im2colConv").cls
BROKEN = ROOT / "tests/operators/ops/broken_conv.py"


def test_a_correct_operator_passes_on_given_shapes_and_on_a_case():
    reports = assert_operator_matches_reference(
        CONV, [(2, 3, 8, 8), (4, 3, 3, 3), (4,)], {"pads": [1, 1, 1, 1], "strides": [2, 2]})
    assert reports[0].passed and reports[0].gradients_checked
    assert_operator_matches_reference(CONV, case=ROOT / "levels/0-operators/conv-1x1.yaml")


@pytest.mark.parametrize("name", ["WrongGradientConv", "WrongPaddingConv", "OffByRelativeConv"])
def test_a_broken_operator_fails_the_assertion_with_the_report(name):
    with pytest.raises(AssertionError, match="disagrees with the ONNX reference") as err:
        assert_operator_matches_reference(f"{BROKEN}:{name}", [(2, 3, 8, 8), (4, 3, 3, 3)],
                                          {"pads": [1, 1, 1, 1]})
    assert "verdict: FAIL" in str(err.value)
