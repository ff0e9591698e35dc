"""JAX operators at level 0: a backward as a jax.custom_vjp rule, JAX's autograd without one, the
example entry validated through its operator host, a wrong backward caught and located, calls
timed only once JAX has computed them, and JAX's own kernels as builtin rows with a backward."""

from __future__ import annotations

import numpy as np
import pytest

from d500.operators.adapters import runner
from d500.operators.base import load
from d500.operators.bench import bench
from d500.operators.validate import Options, validate
from d500.operators.workloads import Case

from .conftest import SUBMISSIONS, case, op

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_custom_vjp_and_autograd_validate_and_a_wrong_backward_is_caught_and_located():
    sig = Case("sig", "Sigmoid", [(6, 50)])
    good = validate(op("jax_ops.py", "JaxSigmoid"), sig)
    assert good.passed and good.gradients_checked, good.text()
    assert good.gradient_dtype == "float64"  # JAX computes the float64 check in float64
    mm = validate(op("jax_ops.py", "JaxMatMul"), Case("mm", "MatMul", [(3, 4, 5), (5, 2)]))
    assert mm.passed and {c.name for c in mm.checks if c.kind == "gradient"} == {"dA", "dB"}
    bad = validate(op("jax_ops.py", "WrongJaxSigmoid"), sig, Options(localise_budget=1.0))
    assert [c.name for c in bad.checks if not c.passed] == ["dX"]
    located = [i * 50 + j for i, j in bad.checks[-1].first]  # every 25th element is wrong
    assert located[0] == 0 and all(k % 25 == 0 for k in located)


def test_the_example_entry_validates_through_its_host_forward_and_gradients():
    loaded = load(str(SUBMISSIONS / "jax-layernorm"), isolated=True)
    try:
        assert loaded.cls.framework == "jax" and loaded.cls.has_backward()
        for c in (case("layernorm-last"),
                  Case("ln-axis1-no-bias", "LayerNormalization", [(3, 4, 5), (4, 5)],
                       {"axis": 1})):
            report = validate(loaded.cls, c, Options(), "jax-layernorm")
            assert report.passed and report.gradients_checked, report.text()
            grads = {ch.name for ch in report.checks if ch.kind == "gradient"}
            assert grads >= {"dX", "dScale"}
    finally:
        loaded.cls.close()


def test_a_timed_call_returns_only_once_jax_has_computed_it():
    # JAX dispatches asynchronously: a call that is not waited for returns in microseconds
    # while its work (here ~1 GFLOP) runs on; the timed forward and backward wait for theirs
    run = runner(op("jax_ops.py", "SlowJaxMatMul")())
    inputs = [np.ones((8, 8), np.float32), np.ones((8, 8), np.float32)]
    (out,) = run.timed_forward(inputs)()
    assert out.is_ready()
    (grad_a, grad_b) = run.timed_backward(inputs, [np.ones((8, 8), np.float32)])()
    assert grad_a.is_ready() and grad_b.is_ready()
    import jax
    unwaited = jax.jit(run.fn)(*run.to_native(inputs))[0]
    assert not unwaited.is_ready()  # what the wait guards against
    unwaited.block_until_ready()


def test_jax_kernels_are_builtin_rows_with_a_backward_beside_the_operator():
    result = bench(op("jax_ops.py", "JaxSigmoid"), Case("sig-bench", "Sigmoid", [(64, 256)],
                                                        time_budget=0.3),
                   ["jax", "jax:eager"], "jax-sigmoid")
    rows = {r.backend + ("" if r.submission != "builtin" else " builtin"): r for r in result.rows}
    assert set(rows) == {"jax", "jax builtin", "jax:eager builtin"}
    for row in result.rows:
        assert row.status == "ok" and row.figures["backward_latency"] > 0, row
    assert rows["jax"].backward_note == "the operator's backward"
    assert "jax.vjp" in rows["jax builtin"].backward_note
    assert "op by op" in rows["jax:eager builtin"].backward_note
