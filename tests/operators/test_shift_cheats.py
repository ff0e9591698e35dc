"""Operators written against the call check's shift (tests/operators/ops/shift_cheats.py): a
MatMul that answers each call's checksum from a cached output, since (x + u) B = x B + u B, and
a Relu that answers from prefix sums over its input sorted once per residue class. Against the
shift before each call got its own window of a 65,521-number pattern and of the weights, both
passed the check and were recorded faster than honest (benchmarks/shift_cheats.py, README; this
test fails on that code); now both answer wrong and are caught. A MatMul that gathers rows of a
table of every window of the pattern times B (WindowMatMul) passed until a forward's second
float input got its own window too (fails on the code before)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from d500 import cli
from d500.ledger import Ledger
from d500.operators import CustomOperator, host
from d500.operators.adapters import runner

from .conftest import ROOT

CHEATS = Path(__file__).parent / "ops" / "shift_cheats.py"
CASES = ROOT / "levels" / "0-operators"


@pytest.mark.parametrize(("name", "case"), [("CachedMatMul", "matmul-batched"),
                                            ("PrefixRelu", "relu-4d"),
                                            ("WindowMatMul", "matmul-batched")])
def test_a_cheat_on_the_shifts_structure_is_caught_and_recorded_failed(name, case, home,
                                                                       capsys, monkeypatch):
    monkeypatch.setattr(host, "OVERHEAD", 0.5)  # short round trips: a fast test, same checks
    code = cli.main(["op", "bench", f"{CHEATS}:{name}", "--case", str(CASES / f"{case}.yaml"),
                     "--backends", "reference", "--budget", "0.1"])
    (mine,) = [r for r in Ledger().runs(level=0) if r["submission"] != "builtin"]
    assert code == 1 and mine["status"] == "failed", mine
    assert "timed forward call" in mine["error"] and "did not run every call" in mine["error"]
    assert "latency" not in (mine["figures"] or {})
    assert "did not run every call" in capsys.readouterr().err



class FrozenB(CustomOperator):
    """A MatMul that reads its second input once and keeps it: right on the first call only."""
    op_type = "MatMul"
    framework = "numpy"

    def forward(self, a, b):
        if not hasattr(self, "b"):
            self.b = b.copy()
        return a @ self.b


class Honest(CustomOperator):
    op_type = "MatMul"
    framework = "numpy"

    def forward(self, a, b):
        return a @ b


@pytest.mark.parametrize(("cls", "caught"), [(FrozenB, True), (Honest, False)])
def test_each_forward_call_shifts_the_second_float_input_too(cls, caught):
    """Level 0 shifts a MatMul's B by its own window per call (what closes WindowMatMul): a
    forward that ignores B's changes is caught, an honest one passes."""
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in [(4, 64, 128), (128, 96)]]

    def reference(arrays):
        return [arrays[0] @ arrays[1]]
    timed = host.checked_forward(runner(cls()), inputs, reference, (1e-4, 1e-5))
    assert timed.second == 1
    timed()
    problem = timed.verify(reference, 1e-4, 1e-5)
    assert (problem is not None and "did not run every call" in problem) == caught, problem


@pytest.mark.xfail(strict=True, reason="a backward shifts its first output gradient only: "
                   "GradientWindowMatMul answers (g + u) B^T and A^T (g + u) from tables of the "
                   "pattern's windows made once, and passes (README: still open); closing it "
                   "needs an input shifted too, which a backward timed on a graph recorded once "
                   "(torch, JAX, TensorFlow) cannot take without re-running its forward")
def test_a_backward_cheat_on_the_output_gradients_windows_is_caught(home, monkeypatch):
    monkeypatch.setattr(host, "OVERHEAD", 0.5)
    code = cli.main(["op", "bench", f"{CHEATS}:GradientWindowMatMul", "--case",
                     str(CASES / "matmul-batched.yaml"), "--backends", "reference",
                     "--budget", "0.1"])
    (mine,) = [r for r in Ledger().runs(level=0) if r["submission"] != "builtin"]
    assert code == 1 and mine["status"] == "failed", mine
    assert "did not run every call" in mine["error"]
