"""Output comparison: errors relative to the output's scale, per-dtype tolerance, NaN/inf places."""

from __future__ import annotations

import numpy as np

from d500.networks.compare import compare, rtol_for


def test_float32_rounding_agrees_and_a_real_error_does_not():
    rng = np.random.default_rng(0)
    want = rng.standard_normal((4, 100)).astype(np.float32)
    noisy = want + (1e-6 * rng.standard_normal(want.shape)).astype(np.float32)
    c = compare("y", noisy, want)
    assert c.ok and 0 < c.max_rel < 1e-5 and c.rtol == rtol_for(np.float32) == 1e-3
    wrong = want.copy()
    wrong[2, 7] += 0.05 * np.abs(want).max()  # one element off by 5% of the output's scale
    c = compare("y", wrong, want)
    assert not c.ok and abs(c.max_rel - 0.05) < 1e-3 and "1 of 400" in c.note


def test_error_is_relative_to_the_scale_not_to_tiny_elements():
    want = np.array([1000.0, 1e-6], np.float32)
    got = np.array([1000.0, 2e-6], np.float32)  # 100% off on an element 1e9 times smaller
    assert compare("y", got, want).ok


def test_shapes_nans_infinities_and_integers():
    a = np.array([1.0, np.nan, np.inf], np.float32)
    assert compare("y", a, a.copy()).ok
    assert not compare("y", np.array([1.0, 2.0, np.inf], np.float32), a).ok
    assert not compare("y", np.array([1.0, np.nan, -np.inf], np.float32), a).ok
    assert "shape 2 instead of 3" in compare("y", a[:2], a).note
    ints = np.array([1, 2, 3], np.int64)
    assert compare("y", ints.copy(), ints).ok
    c = compare("y", np.array([1, 2, 4], np.int64), ints)
    assert not c.ok and c.max_abs == 1 and c.rtol == 0
    assert compare("y", np.zeros(3, np.float32), np.zeros(3, np.float32)).max_rel == 0
    assert not compare("y", np.ones(3, np.float32), np.zeros(3, np.float32)).ok
