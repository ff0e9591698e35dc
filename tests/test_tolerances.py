"""d500.tolerances: the one table of dtype tolerances that levels 0 and 1 judge with."""

from __future__ import annotations

import numpy as np
import pytest

from d500 import tolerances
from d500.networks.compare import compare, rtol_for


@pytest.mark.parametrize("dtype, want", [
    ("float64", (1e-9, 1e-11)), ("float32", (1e-4, 1e-5)), ("float16", (1e-2, 1e-2)),
    ("int32", (0.0, 0.0)), ("int64", (0.0, 0.0)), (np.uint8, (0.0, 0.0)), ("bool", (0.0, 0.0)),
    ("complex64", (1e-4, 1e-5)),  # a dtype the table lacks is judged as float32
])
def test_operator_forward(dtype, want):
    assert tolerances.operator_forward(dtype) == want


@pytest.mark.parametrize("dtype, want", [
    ("float64", 1e-6), ("float32", 1e-3), (np.float16, 5e-2), ("complex128", 1e-3)])
def test_operator_gradient(dtype, want):
    assert tolerances.operator_gradient(dtype) == want


@pytest.mark.parametrize("dtype, want", [
    ("float64", 1e-9), ("float32", 1e-3), ("float16", 2e-2), ("int64", 0.0), ("bool", 0.0),
    ("complex64", 1e-3)])
def test_network(dtype, want):
    assert tolerances.network(dtype) == want == rtol_for(dtype)


def test_network_comparison_uses_the_table():
    want = np.array([1.0, -2.0, 4.0], dtype=np.float32)
    assert compare("y", want + np.float32(3e-3), want).ok          # 7.5e-4 of the scale
    assert not compare("y", want + np.float32(5e-3), want).ok      # 1.25e-3 > 1e-3
    assert compare("y", want + np.float32(5e-3), want).rtol == 1e-3
