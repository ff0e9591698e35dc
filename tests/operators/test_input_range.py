"""Gradient and forward checks over the operator's whole input range: input 0 at x1, x4 and x16
inside the operator's domain and the case's declared range, away from kinks; edge values checked
for gradients too. Bugs that live only in the tails, on negative inputs, on a padded border or at
edge values are caught; correct operators pass every set."""

from __future__ import annotations

import numpy as np
import pytest

from d500.operators.gradcheck import steps
from d500.operators.inputs import edge_inputs, interval
from d500.operators.validate import Options, prepare, validate
from d500.operators.workloads import Case

from .conftest import case, op

SMALL_CONV = Case("small-conv", "Conv", [(2, 4, 9, 9), (6, 4, 3, 3), (6,)], {"pads": [1, 1, 1, 1]})


def kinds(report, passed=None):
    return [c.kind for c in report.checks if passed is None or c.passed == passed]


def test_input_0_spans_each_scale_with_distinct_values():
    prepared = prepare(case("sigmoid-2d"))
    assert [s.label for s in prepared.sets] == ["x1", "x4", "x16"]
    for s, scale in zip(prepared.sets, (1, 4, 16)):
        x = s.inputs[0].astype(np.float64)
        assert x.min() >= -2 * scale and x.max() < 2 * scale
        assert x.max() > 1.9 * scale and x.min() < -1.9 * scale  # the whole span is used
        assert np.unique(x).size == x.size
        assert s.expected is not None and s.expected[0].shape == x.shape
    x1, x4 = prepared.sets[0].inputs[0], prepared.sets[1].inputs[0]
    assert not np.allclose(x4, 4 * x1)  # its own permutation, not a rescaled copy


def test_domains_and_declared_ranges_are_respected_at_every_scale():
    log = prepare(case("log-2d"))
    assert [s.label for s in log.sets] == ["x1", "x4", "x16"]
    assert all(float(s.inputs[0].min()) > 0 for s in log.sets)
    assert float(log.sets[2].inputs[0].max()) > 30  # (0, 32) at x16
    pow_ = prepare(case("pow-broadcast"))
    assert all(float(s.inputs[0].min()) > 0 for s in pow_.sets)
    assert all(-2 <= float(s.inputs[1].min()) and float(s.inputs[1].max()) <= 3
               for s in pow_.sets)
    bn = prepare(case("batchnorm-inference"))
    var = [s.inputs[4] for s in bn.sets]
    assert all(0.5 <= float(v.min()) and float(v.max()) <= 1.5 for v in var)
    # a range the scales cannot widen gives one set only, spanning the range
    ranged = Case("ranged", "Relu", [(64,)], ranges=[(0.5, 1.0)])
    (only,) = prepare(ranged).sets
    assert 0.5 <= float(only.inputs[0].min()) and float(only.inputs[0].max()) <= 1.0
    assert interval(ranged, 16) == (0.5, 1.0)
    edges = edge_inputs(case("log-2d"), log.inputs, np.random.default_rng(0))
    assert edges is not None and float(edges[0].min()) > 0  # no 0, -0 or negatives for Log
    assert float(edges[0].max()) >= 1e4 and float(edges[0].min()) < 1e-37  # large and tiny


@pytest.mark.parametrize("name, points", [
    ("hardsigmoid-2d", lambda s: [-2.5, 2.5]),
    ("clip-bounds", lambda s: [float(s.inputs[1]), float(s.inputs[2])]),
    ("relu-4d", lambda s: [0.0])])
def test_no_grid_value_near_a_kink_and_no_step_crosses_one(name, points):
    for s in prepare(case(name)).sets:
        x = s.inputs[0].astype(np.float64)
        spacing = (x.max() - x.min()) / x.size
        for c in points(s):
            assert np.min(np.abs(x - c)) >= spacing / 4 * 0.99
            a = steps(x, True, s.kinks, s.poles)
            assert np.all(4 * a < np.abs(x - c))  # |step| <= 4 a never reaches the kink


@pytest.mark.parametrize("name, case_", [
    ("Sigmoid", "sigmoid-2d"), ("Tanh", "tanh-2d"), ("Softplus", "softplus-2d"),
    ("Erf", "erf-2d"), ("HardSigmoid", "hardsigmoid-2d")])
def test_correct_numpy_operators_pass_on_every_set(name, case_):
    report = validate(op("numpy_ops.py", name), case(case_))
    assert report.passed, report.text()
    assert {"output", "output x4", "output x16", "edge output", "gradient", "gradient x4",
            "gradient x16", "edge gradient"} <= set(kinds(report))
    assert report.gradient_dtype == "float64" and report.gradient_error < 1e-6


@pytest.mark.parametrize("name, case_, failing", [
    ("TailGradientSigmoid", "sigmoid-2d", {"gradient x4", "gradient x16"}),
    ("FlatHardSigmoid", "hardsigmoid-2d", {"gradient x4", "gradient x16", "edge gradient"}),
    ("ClampedTanh", "tanh-2d", {"output x4", "output x16", "edge output", "gradient x4",
                                "gradient x16", "edge gradient"})])
def test_bugs_only_in_the_tails_fail_where_x1_passes(name, case_, failing):
    report = validate(op("numpy_ops.py", name), case(case_), Options(localise_budget=0.5))
    assert not report.passed
    assert set(kinds(report, passed=False)) == failing, report.text()
    assert "output" in kinds(report, passed=True) and "gradient" in kinds(report, passed=True)


def test_tail_bug_is_located_in_the_tail():
    report = validate(op("numpy_ops.py", "TailGradientSigmoid"), case("sigmoid-2d"),
                      Options(localise_budget=2.0))
    prepared = prepare(case("sigmoid-2d"))
    x4 = prepared.sets[1].inputs[0]
    bad = next(c for c in report.checks if c.kind == "gradient x4" and not c.passed)
    assert bad.first and all(abs(float(x4[tuple(i)])) > 2 for i in bad.first)


@pytest.mark.parametrize("name, case_, failing", [
    ("NegativeGradientSoftplus", "softplus-2d", "gradient"),
    ("OddErf", "erf-2d", "output")])
def test_bugs_only_on_negative_inputs_fail(name, case_, failing):
    report = validate(op("numpy_ops.py", name), case(case_), Options(localise_budget=0.5))
    assert not report.passed and failing in kinds(report, passed=False), report.text()


@pytest.mark.parametrize("name, wrong", [
    ("BorderGradientConv", "dX"), ("EdgePaddedWeightGradientConv", "dW")])
def test_bugs_only_on_a_padded_border_fail(name, wrong):
    report = validate(op("numpy_ops.py", name), SMALL_CONV, Options(localise_budget=0.5))
    assert not report.passed
    assert [c.name for c in report.checks if not c.passed] == [wrong], report.text()
    assert all(c.passed for c in report.checks if "output" in c.kind)


@pytest.mark.slow
def test_a_padded_border_bug_fails_on_the_big_conv_case():
    report = validate(op("numpy_ops.py", "BorderGradientConv"), case("conv-3x3-pad1"),
                      Options(localise_budget=0.5))
    assert [c.name for c in report.checks if not c.passed] == ["dX"]
    assert report.gradient_error > 100 * 1e-6  # far beyond float64's tolerance


@pytest.mark.serial  # localised within a wall-clock budget (0.5 s): alone
def test_a_bug_at_edge_values_only_fails_the_edge_gradient_check():
    report = validate(op("numpy_ops.py", "OverflowingSoftplus"), case("softplus-2d"),
                      Options(localise_budget=0.5))
    assert kinds(report, passed=False) == ["edge gradient"], report.text()
    located = next(c for c in report.checks if not c.passed)
    prepared = prepare(case("softplus-2d"))  # validate draws the edge values first from its rng
    edged = edge_inputs(case("softplus-2d"), prepared.inputs, prepared.rng)
    assert located.first
    assert all(float(edged[0][tuple(i)]) > 709 for i in located.first)  # exp overflows there


def test_edge_gradients_skip_what_the_reference_cannot_differentiate():
    # Exp at the edge values overflows (exp(1e4)): those elements are left out, the rest checked
    report = validate(op("torch_ops.py", "Exp"), case("exp-2d"))
    assert report.passed, report.text()
    edge = next(c for c in report.checks if c.kind == "edge gradient")
    assert edge.method.startswith("joint") and edge.max_rel < 1e-6


@pytest.mark.serial  # localised within a wall-clock budget (5 s): alone
@pytest.mark.parametrize("budget, located", [(0.0, False), (5.0, True)])
def test_a_failed_directional_check_says_what_was_compared_and_where(budget, located):
    """A derivative 2e-4 off only at |x| > 8 (the x16 set) fails along random directions; the
    summary says so, with the tolerance, and never reads '0 mismatches' beside FAIL: either the
    elements bisection found, or that the error could not be pinned to elements (issue 22)."""
    report = validate(op("numpy_ops.py", "LargeInputsGradientSoftplus"), case("softplus-2d"),
                      Options(localise_budget=budget))
    assert kinds(report, passed=False) == ["gradient x16"], report.text()
    summary = report.summary()
    assert summary.startswith("gradient x16 dX disagrees with the reference: its derivatives "
                              "along 3 random directions (directional x3) differ from finite "
                              "differences of the reference: max rel error ")
    assert "> tolerance 1.0e-06" in summary and "0 mismatch" not in summary
    line = next(c.line() for c in report.checks if not c.passed)
    if located:
        assert "bisection found at least" in summary and "mismatches >=" in line
    else:
        assert "could not be pinned to single elements of the 16384" in summary
        assert "mismatches not localised/16384" in line and "mismatches 0/" not in line
