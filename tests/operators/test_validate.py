"""Validation against the ONNX reference: correct operators pass, broken ones caught and located."""

from __future__ import annotations

import time

import numpy as np
import pytest

from d500.operators.base import load
from d500.operators.gradcheck import choose_method
from d500.operators.validate import Options, compare, validate
from d500.operators.workloads import Case

from .conftest import SUBMISSIONS, case, op

CONV = load(str(SUBMISSIONS / "numpy-im2col-conv")).cls
SMALL_CONV = Case("small-conv", "Conv", [(2, 4, 9, 9), (6, 4, 3, 3), (6,)],
                  {"pads": [1, 1, 1, 1], "strides": [2, 2]})


def test_numpy_conv_full_validation_of_the_big_case_is_fast():
    # 8x16x32x32 input, 16x16x3x3 weights and bias: forward and all three gradients. Its cost
    # is this process's CPU time (validation runs BLAS on one thread): ~1 s, where the wall
    # time was 5.2 s with three other busy processes on its core
    start = time.process_time()
    report = validate(CONV, case("conv-3x3-pad1"))
    elapsed = time.process_time() - start
    assert report.passed, report.text()
    assert [c.name for c in report.checks if c.kind == "gradient"] == ["dX", "dW", "dB"]
    methods = {c.name: c.method for c in report.checks if c.kind == "gradient"}
    # dX (131,072 elements) and dW (2,304) are too large for the Jacobian; dB (16 elements) gets
    # whichever the time budget allows on this machine.
    assert methods["dX"].startswith("directional") and methods["dW"].startswith("directional")
    assert report.forward_error < 1e-5 and report.gradient_error < 1e-6
    assert elapsed < 10.0, f"validation took {elapsed:.1f} s of CPU time"


def test_small_inputs_get_the_elementwise_jacobian():
    # the cost of one reference call is given, not measured: the choice does not depend on the
    # machine's load (2 x 6 elements x 1 ms fits the 0.5 s budget)
    report = validate(CONV, SMALL_CONV, Options(reference_seconds=1e-3))
    assert report.passed, report.text()
    methods = {c.name: c.method for c in report.checks if c.kind == "gradient"}
    assert methods["dB"] == "elementwise"  # 6 elements
    assert methods["dW"] == "elementwise"  # 216 elements: 0.43 s of finite differences
    assert methods["dX"].startswith("directional")  # 648 elements: too many for the Jacobian
    slow = validate(CONV, SMALL_CONV, Options(reference_seconds=0.1))
    methods = {c.name: c.method for c in slow.checks if c.kind == "gradient"}
    assert methods == {"dX": "directional x3", "dW": "directional x3", "dB": "directional x3"}


@pytest.mark.parametrize("size, seconds, method", [
    (6, 1e-3, "elementwise"), (256, 5e-4, "elementwise"), (257, 1e-6, "directional"),
    (250, 1e-3, "elementwise"), (251, 1e-3, "directional"), (10, 0.025, "elementwise"),
    (10, 0.026, "directional")])
def test_the_method_choice_is_a_pure_function_of_size_and_cost(size, seconds, method):
    # budget 0.5 s, at most 256 elements: 2 reference calls per element must fit the budget
    assert choose_method(size, seconds, 0.5, 256) == method


def test_wrong_gradient_in_3_percent_of_elements_is_caught_and_located():
    report = validate(op("broken_conv.py", "WrongGradientConv"), SMALL_CONV,
                      Options(localise_budget=3.0))
    assert not report.passed
    bad = [c for c in report.checks if not c.passed]
    assert [c.name for c in bad] == ["dX"]
    # every 32nd element of dX is wrong: the first located ones are multiples of 32
    flat = [int(np.ravel_multi_index(tuple(i), SMALL_CONV.shapes[0])) for i in bad[0].first]
    assert flat and all(j % 32 == 0 for j in flat)


def test_a_single_wrong_gradient_element_is_located_exactly():
    small = Case("one-wrong", "Conv", [(2, 3, 8, 8), (4, 3, 3, 3)], {"pads": [1, 1, 1, 1]})
    report = validate(op("broken_conv.py", "OneWrongWeightGradientConv"), small)
    bad = [c for c in report.checks if not c.passed]
    assert [c.name for c in bad] == ["dW"]
    assert bad[0].first == [[0, 1, 2, 1]]


def test_wrong_gradient_in_few_elements_of_a_large_input_is_caught():
    report = validate(op("broken_conv.py", "WrongGradientConv"), case("conv-1x1"),
                      Options(localise_budget=0.5))
    assert not report.passed
    assert [c.name for c in report.checks if not c.passed] == ["dX"]


@pytest.mark.parametrize("error, passes", [(5e-6, False), (2e-7, True)])
def test_a_gradient_error_just_above_the_float64_tolerance_fails(error, passes):
    """Every gradient off by 5e-6 relative (a directional error of 7.7e-6, 8x the float64
    tolerance of 1e-6) fails dX, dW and dB; a tolerance widened 100x (1e-4) would pass it. Off
    by 2e-7, inside the finite differences' own accuracy, it passes."""
    scaled = type("Scaled", (op("broken_conv.py", "ScaledGradientConv"),), {"error": error})
    report = validate(scaled, SMALL_CONV, Options(reference_seconds=1e-3))
    assert report.gradient_dtype == "float64" and report.passed is passes, report.text()
    assert error < report.gradient_error < 2 * error  # (measured: 1.53 x error)
    failed = [c.name for c in report.checks if not c.passed]
    assert failed == ([] if passes else ["dX", "dW", "dB"]), report.text()


@pytest.mark.parametrize("name, case_", [
    ("WrongPaddingConv", SMALL_CONV),
    ("SwappedPaddingConv", Case("asym", "Conv", [(1, 2, 7, 7), (3, 2, 3, 3)],
                                {"pads": [2, 1, 0, 3]})),
    ("OffByRelativeConv", SMALL_CONV)])
def test_broken_forward_is_caught(name, case_):
    report = validate(op("broken_conv.py", name), case_, Options(check_gradients=False))
    assert not report.passed
    assert any(c.kind == "output" and not c.passed for c in report.checks), report.text()


def test_forward_off_by_1e_3_relative_reports_that_error():
    report = validate(op("broken_conv.py", "OffByRelativeConv"), SMALL_CONV,
                      Options(check_gradients=False))
    assert report.forward_error == pytest.approx(1e-3, rel=1e-2)


def test_torch_operator_with_custom_backward_and_its_broken_variant():
    softmax = load(str(SUBMISSIONS / "torch-softmax")).cls
    good = validate(softmax, case("softmax-last-axis"))
    assert good.passed and good.gradients_checked and good.gradient_dtype == "float64"
    bad = validate(op("broken_softmax.py", "WrongGradientSoftmax"), case("softmax-last-axis"),
                   Options(localise_budget=0.5))
    assert [c.name for c in bad.checks if not c.passed] == ["dinput"]


def test_operator_that_raises_is_reported_not_crashing():
    class Crashing(CONV):
        def forward(self, *inputs):
            raise ValueError("boom")
    report = validate(Crashing, SMALL_CONV)
    assert not report.passed and "ValueError: boom" in report.error


def test_compare_tolerances_follow_the_dtype():
    ref = np.linspace(-1, 1, 101)
    assert compare("output", "Y", (ref * (1 + 1e-6)).astype(np.float32), ref, 1e-4, 1e-5).passed
    assert not compare("output", "Y", ref * (1 + 1e-3), ref, 1e-4, 1e-5).passed
    assert not compare("output", "Y", ref * (1 + 1e-8), ref, 1e-9, 1e-11).passed  # float64
    nan_ref = np.array([1.0, np.nan, np.inf])
    assert compare("output", "Y", nan_ref.copy(), nan_ref, 1e-4, 1e-5).passed
    bad = compare("output", "Y", np.array([1.0, 2.0, np.inf]), nan_ref, 1e-4, 1e-5)
    assert not bad.passed and bad.first == [[1]]
    assert not compare("output", "Y", np.ones(3), np.ones(4), 1e-4, 1e-5).passed
    assert compare("output", "Y", np.arange(3), np.arange(3), 0, 0).method == "exact"


def test_a_mistyped_op_type_gets_the_closest_onnx_operator():
    from d500.errors import UsageError
    from d500.operators import CustomOperator
    from d500.operators.base import check_class

    class Typo(CustomOperator):
        op_type, framework = "Rellu", "numpy"

    with pytest.raises(UsageError, match=r"typo.py: Typo.op_type 'Rellu' is not an ONNX "
                                         r"operator of the default domain \(did you mean "
                                         r"'Relu'\?\)$"):
        check_class(Typo, "typo.py")
