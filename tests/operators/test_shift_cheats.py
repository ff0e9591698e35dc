"""Operators written against the call check's shift (tests/operators/ops/shift_cheats.py): a
MatMul that answers each call's checksum from a cached output, since (x + u) B = x B + u B, and
a Relu that answers from prefix sums over its input sorted once per residue class. Against the
shift before each call got its own window of a 65,521-number pattern and of the weights, both
passed the check and were recorded faster than honest (benchmarks/shift_cheats.py, README; this
test fails on that code); now both answer wrong and are caught. A MatMul that gathers rows of a
table of every window of the pattern times B (WindowMatMul) passed until a forward's second
float input got its own window too (fails on the code before). On the backward, MatMuls that
tabulate what the backward makes of the shift's windows, or its transpose of the weights'
windows, passed until each window was multiplied by a window of signs (fails on the code
before); an honest backward passes in each framework."""

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


@pytest.mark.parametrize("name", ["GradientWindowMatMul", "GradientWeightsMatMul"])
def test_a_backward_cheat_on_the_windows_is_caught(name, home, monkeypatch):
    """A backward's shift and weights are each a window of a pattern times a window of signs
    at a start of its own: GradientWindowMatMul (a table of the shift's windows through the
    MatMul) and GradientWeightsMatMul (a table of the weights' windows through its transpose)
    passed before (this test fails on the code before, both) and answer wrong now."""
    monkeypatch.setattr(host, "OVERHEAD", 0.5)
    code = cli.main(["op", "bench", f"{CHEATS}:{name}", "--case",
                     str(CASES / "matmul-batched.yaml"), "--backends", "reference",
                     "--budget", "0.1"])
    (mine,) = [r for r in Ledger().runs(level=0) if r["submission"] != "builtin"]
    assert code == 1 and mine["status"] == "failed", mine
    assert "did not run every call" in mine["error"]


MATMULS = {"numpy": "return a @ b", "torch": "return torch.matmul(a, b)",
           "jax": "return jnp.matmul(a, b)", "tensorflow": "return tf.matmul(a, b)"}
IMPORTS = {"numpy": "", "torch": "import torch", "jax": "import jax.numpy as jnp",
           "tensorflow": "import tensorflow as tf"}


@pytest.mark.parametrize("framework", ["numpy", "torch", "jax",
                                       pytest.param("tensorflow", marks=pytest.mark.slow)])
def test_an_honest_backward_passes_the_check_in_each_framework(framework, tmp_path,
                                                               monkeypatch):
    """Each framework's Runner shifts a backward call's output gradient by the judge's signed
    window and weighs its input gradients by the judge's signed weights (torch's and JAX's own
    checksums): an honest MatMul's backward agrees with the reference call by call."""
    from d500 import tolerances
    from d500.operators.base import load_class
    monkeypatch.setattr(host, "ROUND_TRIP", 0.01)
    backward = ("\n    def backward(self, grad_outputs, inputs, outputs):\n"
                "        (g,), (a, b) = grad_outputs, inputs\n"
                "        return [g @ b.T, np.einsum('bij,bik->jk', a, g)]\n")
    (tmp_path / "mm.py").write_text(
        f"import numpy as np\n{IMPORTS[framework]}\nfrom d500.operators import CustomOperator\n\n"
        f"class MM(CustomOperator):\n    op_type = 'MatMul'\n    framework = '{framework}'\n\n"
        f"    def forward(self, a, b):\n        {MATMULS[framework]}\n"
        + (backward if framework == "numpy" else ""))
    run = runner(load_class(tmp_path / "mm.py", "MM").cls())
    rng = np.random.default_rng(3)
    a, b, g = (rng.standard_normal(s).astype(np.float32)
               for s in [(2, 24, 48), (48, 40), (2, 24, 40)])

    def reference(arrays, grads):
        x, y = (np.asarray(v, np.float64) for v in arrays)
        d = np.asarray(grads[0], np.float64)
        return [d @ y.T, np.einsum("bij,bik->jk", x, d)]
    rtol = tolerances.operator_gradient(np.dtype(np.float32))
    timed = host.checked_backward(run, [a, b], [g], reference, (rtol, rtol / 100))
    timed._ask(host.SAMPLES)  # a round trip of as many calls as the judge recomputes
    assert timed.verify(reference, rtol, rtol / 100) is None
    assert timed.checked == host.SAMPLES and timed.power > 0.9, timed.power
