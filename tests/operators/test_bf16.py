"""bfloat16 and float16 operators: validated against the reference in float64 with dtype-aware
tolerances (d500.tolerances), benchmarked like any other; correct NumPy (ml_dtypes) and torch
operators pass, wrong ones fail."""

from __future__ import annotations

import copy
import json

import ml_dtypes
import numpy as np
import pytest

from d500 import tolerances
from d500.errors import UsageError
from d500.ledger import Ledger
from d500.operators.base import load
from d500.operators.validate import Options, prepare, validate
from d500.operators.workloads import all_cases

from .conftest import ROOT, SUBMISSIONS, case, d500, op

BF16 = np.dtype(ml_dtypes.bfloat16)


def as_dtype(name: str, dtype: str):
    c = copy.copy(case(name))
    c.dtype = dtype
    return c


def test_bf16_tolerances_sit_between_rounding_and_bugs():
    assert tolerances.operator_forward(BF16) == (2.0 ** -5, 2.0 ** -6)
    assert tolerances.operator_gradient(BF16) == 0.125
    u = 2.0 ** -8  # bfloat16's unit roundoff: its tolerances are a few u, float16's tighter
    assert 4 * u <= tolerances.operator_forward(BF16)[0] <= 8 * u
    assert tolerances.operator_forward(np.float16)[0] < tolerances.operator_forward(BF16)[0]


def test_a_bf16_case_draws_bf16_inputs_and_judges_in_float64():
    bf = case("matmul-batched-bf16")
    assert bf.np_dtype == BF16
    prepared = prepare(bf)
    assert all(a.dtype == BF16 for a in prepared.inputs)
    assert prepared.expected[0].dtype == np.float64
    # the reference ran on the bf16-rounded values
    a, b = (x.astype(np.float64) for x in prepared.inputs)
    assert np.allclose(prepared.expected[0], a @ b, rtol=1e-12, atol=0)


@pytest.mark.parametrize("name, case_, dtype", [
    ("Bf16Sigmoid", "sigmoid-2d", "bfloat16"), ("Bf16Sigmoid", "sigmoid-2d", "float16"),
    ("Bf16MatMul", "matmul-batched-bf16", "bfloat16")])
def test_correct_numpy_half_precision_operators_pass(name, case_, dtype):
    report = validate(op("bf16_ops.py", name), as_dtype(case_, dtype))
    assert report.passed, report.text()
    rtol = tolerances.operator_forward(np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16"
                                       else dtype)[0]
    # really rounded to the dtype (float32 would err by 1e-7), well inside its tolerance
    assert 1e-5 < report.forward_error < rtol / 4
    assert report.gradient_dtype == "float64" and report.gradient_error < 1e-6


@pytest.mark.parametrize("name, case_, failing", [
    ("Float8Sigmoid", "sigmoid-2d", "output"),      # rounds through float8: 2^-4 steps
    ("FirstBatchMatMul", "matmul-batched-bf16", "gradient")])
def test_wrong_bf16_operators_fail(name, case_, failing):
    report = validate(op("bf16_ops.py", name), as_dtype(case_, "bfloat16"),
                      Options(localise_budget=0.5))
    assert not report.passed
    assert failing in [c.kind for c in report.checks if not c.passed], report.text()


def test_torch_bf16_operators_pass_and_a_wrong_gradient_fails():
    softmax = load(str(SUBMISSIONS / "torch-softmax")).cls
    good = validate(softmax, case("softmax-last-axis-bf16"))
    assert good.passed, good.text()
    for name, case_ in (("Sigmoid", "sigmoid-2d"), ("MatMul", "matmul-batched-bf16")):
        report = validate(op("torch_ops.py", name), as_dtype(case_, "bfloat16"))
        assert report.passed and report.forward_error > 1e-5, report.text()
    bad = validate(op("broken_softmax.py", "WrongGradientSoftmax"),
                   case("softmax-last-axis-bf16"), Options(localise_budget=0.5))
    assert [c.name for c in bad.checks if not c.passed] == ["dinput"]


def test_an_operator_the_onnx_schema_refuses_in_bf16_is_a_usage_error():
    with pytest.raises(UsageError, match="unsupported type: tensor\\(bfloat16\\)"):
        prepare(as_dtype("conv-1x1", "bfloat16"))  # Conv has no bfloat16 before opset 22


def _bf16_only(cls, dtype: str):
    import torch
    want = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]

    class Only(cls):
        def forward(self, *xs):
            if any(x.dtype != want for x in xs if x is not None and x.is_floating_point()):
                raise TypeError(f"{dtype} only")
            return super().forward(*xs)
    return Only


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_torch_kernels_run_in_half_precision_alone_pass_every_case(dtype):
    """The measurement behind the half-precision tolerances: torch's CPU kernels, forward and
    backward in that dtype alone (the gradient judged at the dtype's own tolerance), pass every
    case the ONNX schema allows in it."""
    checked = 0
    for c in all_cases(ROOT / "levels" / "0-operators"):
        c = copy.copy(c)
        c.dtype = dtype
        try:
            prepare(c)
        except UsageError:
            continue  # e.g. Conv and pooling have no bfloat16 in opset 21
        report = validate(_bf16_only(op("torch_ops.py", c.op_type), dtype), c)
        assert report.passed, report.text()
        assert report.gradient_dtype == dtype
        checked += 1
    assert checked >= (17 if dtype == "bfloat16" else 27)


def test_validate_and_bench_bf16_from_the_cli(home):
    ops = ROOT / "tests/operators/ops"
    sigmoid = ["--case", "levels/0-operators/sigmoid-2d.yaml", "--dtype", "bfloat16"]
    good = d500("op", "validate", f"{ops}/bf16_ops.py:Bf16Sigmoid", *sigmoid, home=home)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "sigmoid-2d-bfloat16" in good.stdout and "verdict: PASS" in good.stdout
    bad = d500("op", "validate", f"{ops}/bf16_ops.py:Float8Sigmoid", *sigmoid, home=home)
    assert bad.returncode == 1 and "verdict: FAIL" in bad.stdout
    out = d500("op", "bench", f"{ops}/bf16_ops.py:Bf16MatMul", "--case",
               "levels/0-operators/matmul-batched-bf16.yaml", "--backends", "torch,reference",
               "--budget", "0.2", "--json", home=home)
    assert out.returncode == 0, out.stderr
    (result,) = json.loads(out.stdout)
    assert result["dtype"] == "bfloat16"
    rows = {r["backend"]: r for r in result["rows"]}
    assert set(rows) == {"numpy", "torch", "reference"}
    for r in rows.values():
        assert r["status"] == "ok", r
        assert r["figures"]["latency"] > 0 and r["figures"]["backward_latency"] > 0
        assert r["backward_timing"]["repetitions"] >= 3
    ledger = Ledger(home / "ledger.sqlite")
    try:
        runs = ledger.runs(level=0)
    finally:
        ledger.close()
    bench_runs = [r for r in runs if r["hyperparameters"]["mode"] == "bench"]
    assert len(bench_runs) == 3
    assert all(r["hyperparameters"]["dtype"] == "bfloat16" and r["status"] == "succeeded"
               and r["figures"]["backward_latency"] > 0 for r in bench_runs)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_reference_backend_passes_every_half_precision_case_as_a_builtin_row(dtype):
    """The built-in reference row of `d500 op bench` in half precision: its forward agrees with
    the float64 judge on every case the ONNX schema allows in that dtype (its Softmax summed
    bfloat16 in bfloat16 and failed softmax-last-axis-bf16, 4.4 % off)."""
    from d500.operators.bench import _backend
    from d500.operators.dtypes import saturate
    checked, failed = 0, []
    for c in all_cases(ROOT / "levels" / "0-operators"):
        c = copy.copy(c)
        c.dtype = dtype
        try:
            prepared = prepare(c)
        except UsageError:
            continue
        rtol, atol = tolerances.operator_forward(c.np_dtype)
        row, _, _ = _backend("reference", c, [a.copy() for a in prepared.inputs],
                             saturate(prepared.expected, c.np_dtype)[0], rtol, atol)
        checked += 1
        if row.status != "ok":
            failed.append(f"{c.name}: {row.error}")
    assert not failed and checked >= (17 if dtype == "bfloat16" else 27), failed
