"""AlgoPerf's performance profile (d500.profile): rho(tau), its exact normalised integral up to
tau = 4, missing workloads never within tau, and the geometric mean over the workloads run."""

from __future__ import annotations

import math

import pytest

from d500 import profile


def test_score_is_the_exact_integral_of_the_step_profile():
    # a: best on w1, 1.2345x on w2, 5x (beyond tau = 4) on w3; b: did not run w2 and w3.
    p = profile.build({"a": {"w1": 1.0, "w2": 1.2345, "w3": 5.0}, "b": {"w1": 2.5}},
                      ["w1", "w2", "w3"])
    # by hand: each workload adds (4 - r) / 3 (0 past 4, 0 when missing), averaged over all 3
    assert p.score("a") == pytest.approx(((4 - 1) / 3 + (4 - 1.2345) / 3 + 0) / 3, abs=1e-12)
    assert p.score("b") == pytest.approx((4 - 2.5) / 3 / 3, abs=1e-12)
    assert 1.2345 in p.taus and 2.5 in p.taus and p.taus[0] == 1.0 and p.taus[-1] == 4.0
    at = {t: i for i, t in enumerate(p.taus)}
    assert p.rho["a"][at[1.0]] == pytest.approx(1 / 3)  # best on one of three
    assert p.rho["a"][at[1.2345]] == pytest.approx(2 / 3)  # within tau from the ratio on
    assert p.rho["a"][at[4.0]] == pytest.approx(2 / 3)  # 5x is never within tau <= 4
    assert p.rho["b"][at[2.0]] == 0 and p.rho["b"][at[2.5]] == pytest.approx(1 / 3)


def test_missing_workloads_count_against_rho_but_not_the_geomean():
    p = profile.build({"a": {"w1": 2.0, "w2": 8.0}, "b": {"w1": 1.0, "w2": 1.0},
                       "c": {"w1": 4.0, "w2": None}}, ["w1", "w2"])
    assert (p.ran("a"), p.ran("b"), p.ran("c")) == (2, 2, 1)
    assert p.geomean("a") == pytest.approx(4.0)  # sqrt(2 * 8)
    assert p.geomean("c") == pytest.approx(4.0)  # over its one workload only
    assert p.score("b") == pytest.approx(1.0) and p.best_on("b") == 2
    assert p.score("c") == pytest.approx(0.0)  # 4x on w1 is within tau only at tau = 4
    assert p.rho["c"][-1] == pytest.approx(0.5)  # and w2 never


def test_geometric_mean_edges():
    assert profile.geometric_mean([]) is None
    assert profile.geometric_mean([1.0, math.inf]) == math.inf
    assert profile.geometric_mean([2.0, 8.0]) == pytest.approx(4.0)


def test_lower_is_better_scores_leave_out_workloads_nobody_met():
    p = profile.from_scores({"a": {"w1": 10.0, "w2": math.inf, "w3": 3.0},
                             "b": {"w1": 20.0, "w2": math.inf}})
    assert p.workloads == ["w1", "w3"]  # w2: no entry met it
    assert p.ratios["b"] == {"w1": 2.0}
    assert p.score("b") == pytest.approx((4 - 2) / 3 / 2, abs=1e-12)
    taus = profile.taus()
    assert profile.performance_profile({"a": {"w": 1.0}, "b": {"w": 3.0}}, taus)["b"] == [
        float(t >= 3.0) for t in taus]
