"""Benchmarks: FLOP formulas, timing statistics of the forward and of the backward alone, failing
implementations never timed; frameworks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from d500.operators import CustomOperator, flops
from d500.operators.base import load
from d500.operators.bench import bench
from d500.operators.validate import Options, validate
from d500.operators.workloads import Case

from .conftest import SUBMISSIONS, case, op


def test_conv_flops_match_a_direct_count():
    # direct: every output element of every group sums C/group * kh * kw products
    x, w, attrs = (2, 8, 10, 10), (6, 4, 3, 3), {"group": 2, "strides": [2, 2]}
    y = (2, 6, 4, 4)
    macs = sum(1 for _ in np.ndindex(*y)) * (8 // 2) * 9
    assert flops.count("Conv", attrs, [x, w], [y]) == 2 * macs
    assert flops.count("Gemm", {"transA": 1}, [(5, 4), (5, 3), (3,)], [(4, 3)]) == 2 * 60 + 12
    assert flops.count("MatMul", {}, [(4, 8, 16), (16, 2)], [(4, 8, 2)]) == 2 * 64 * 16
    assert flops.count("MaxPool", {"kernel_shape": [2, 2]}, [(1, 1, 4, 4)], [(1, 1, 2, 2)]) == 16
    assert flops.count("Relu", {}, [(3,)], [(3,)]) is None


def test_bench_times_the_operator_and_the_backends_with_statistics():
    conv = load(str(SUBMISSIONS / "numpy-im2col-conv")).cls
    c = Case("bench-conv", "Conv", [(2, 4, 12, 12), (8, 4, 3, 3)], {"pads": [1, 1, 1, 1]},
             time_budget=0.2)
    result = bench(conv, c, ["reference"], "numpy-im2col-conv", peak=1e11)
    assert [r.status for r in result.rows] == ["ok", "ok"]
    assert result.flops == 2 * (2 * 8 * 12 * 12) * 4 * 9
    for row in result.rows:
        t = row.timing
        assert t["repetitions"] >= 3 and t["q1"] <= t["median"] <= t["q3"]
        assert t["ci95"][0] <= t["median"] <= t["ci95"][1]
        assert row.figures["latency"] == t["median"]
        assert math.isclose(row.figures["gflops"], result.flops / t["median"] / 1e9)
        assert math.isclose(row.figures["peak_fraction"], 100 * result.flops / t["median"] / 1e11)
    assert "GFLOP/s" in result.text() and "% of peak" in result.text()


def test_bench_times_the_backward_alone_as_a_separate_figure():
    conv = load(str(SUBMISSIONS / "numpy-im2col-conv")).cls
    c = Case("bench-conv-bwd", "Conv", [(2, 4, 12, 12), (8, 4, 3, 3), (8,)],
             {"pads": [1, 1, 1, 1]}, time_budget=0.3)
    result = bench(conv, c, ["reference", "torch", "onnxruntime"], "numpy-im2col-conv")
    rows = {r.backend: r for r in result.rows}
    assert [r.status for r in result.rows] == ["ok"] * 4
    for name in ("numpy", "reference", "torch"):
        row = rows[name]
        t = row.backward_timing
        assert t is not None and t["repetitions"] >= 3 and t["includes"] == "backward"
        assert t["q1"] <= t["median"] <= t["q3"]
        assert row.figures["backward_latency"] == t["median"] > 0
        assert row.figures["latency"] == row.timing["median"] > 0
    assert rows["numpy"].backward_note == "the operator's backward"
    assert "autograd.grad" in rows["torch"].backward_note
    assert "VJP" in rows["reference"].backward_note
    # onnxruntime is inference only: a forward figure, no backward
    assert "backward_latency" not in rows["onnxruntime"].figures
    assert rows["onnxruntime"].backward_timing is None
    text = result.text()
    assert text.count("backward median") == 3 and text.count("forward  median") == 4


def test_an_operator_without_backward_gets_no_backward_figure():
    class ForwardOnlyRelu(CustomOperator):
        op_type = "Relu"

        def forward(self, x):
            return np.maximum(x, 0)

    result = bench(ForwardOnlyRelu, Case("relu-fwd", "Relu", [(64, 64)], time_budget=0.1),
                   [], "forward-only")
    (row,) = result.rows
    assert row.status == "ok" and row.figures["latency"] > 0
    assert "backward_latency" not in row.figures and row.backward_note.startswith("none")


def test_a_reference_backward_through_a_function_expansion_is_timed_net_of_the_forward():
    # LayerNormalization has no VJP of its own in the reference: it is differentiated through
    # its ONNX function, timed as forward+backward, and the forward's median subtracted
    layernorm = op("torch_ops.py", "LayerNormalization")
    c = case("layernorm-last")
    c.time_budget = 0.3
    result = bench(layernorm, c, ["reference"], "torch-layernorm")
    ref = result.rows[1]
    t = ref.backward_timing
    assert t["includes"] == "forward+backward"
    assert ref.figures["backward_latency"] == t["backward_median"]
    assert math.isclose(t["backward_median"], t["median"] - ref.timing["median"])


def test_failing_operator_is_not_timed():
    c = Case("bench-bad", "Conv", [(1, 2, 6, 6), (3, 2, 3, 3)], time_budget=0.1)
    result = bench(op("broken_conv.py", "OffByRelativeConv"), c, [], "bad")
    (row,) = result.rows
    assert row.status == "failed" and row.timing is None and "latency" not in row.figures
    assert result.operator_failed and "FAILED" in result.text()


@pytest.mark.slow
def test_tensorflow_operators_custom_gradient_and_autograd():
    sig = Case("sig", "Sigmoid", [(6, 50)])
    good = validate(op("tf_ops.py", "TfSigmoid"), sig)
    assert good.passed and good.gradients_checked, good.text()
    mm = validate(op("tf_ops.py", "TfMatMul"), Case("mm", "MatMul", [(3, 4, 5), (5, 2)]))
    assert mm.passed and {c.name for c in mm.checks if c.kind == "gradient"} == {"dA", "dB"}
    bad = validate(op("tf_ops.py", "WrongTfSigmoid"), sig, Options(localise_budget=1.0))
    assert [c.name for c in bad.checks if not c.passed] == ["dX"]
    located = [i * 50 + j for i, j in bad.checks[-1].first]  # every 25th element is wrong
    assert located[0] == 0 and all(k % 25 == 0 for k in located)
    # the backward timed alone: the custom gradient on a persistent tape, and the backend's own
    result = bench(op("tf_ops.py", "TfSigmoid"), Case("sig-bench", "Sigmoid", [(64, 256)],
                                                      time_budget=0.3), ["tensorflow"], "tf")
    for row in result.rows:
        assert row.status == "ok" and row.figures["backward_latency"] > 0, row
    assert "GradientTape" in result.rows[1].backward_note


def test_a_row_faster_than_the_peak_has_it_measured_again_and_never_a_fraction_over_100(
        tmp_path, monkeypatch):
    """A peak measured on a loaded machine can read below what an operator then reaches (124 %
    once in CI): the row makes d500 measure the peak again, and a fraction still over 100 % is
    dropped with its reason, never recorded."""
    from types import SimpleNamespace

    from d500 import provenance
    from d500.operators.run import _beaten
    monkeypatch.setenv("D500_HOME", str(tmp_path))
    monkeypatch.setattr(provenance, "_peak_memo", {})
    low = 1e6  # 1 MFLOP/s: a peak far below any real one, as if measured under heavy load
    rows = [SimpleNamespace(figures={"gflops": g, "peak_fraction": 100 * g * 1e9 / low},
                            timing={}) for g in (0.01, 1e7)]  # 10 MFLOP/s; 10 PFLOP/s
    peak = _beaten(rows, low)
    assert peak > 1e8 and peak == provenance.peak_flops()  # measured again, and cached
    assert 0 < rows[0].figures["peak_fraction"] < 100 and "peak_note" not in rows[0].timing
    assert "peak_fraction" not in rows[1].figures
    assert "above the machine's peak measured again" in rows[1].timing["peak_note"]
    honest = [SimpleNamespace(figures={"gflops": 0.01, "peak_fraction": 50.0}, timing={})]
    assert _beaten(honest, low) == low and honest[0].figures["peak_fraction"] == 50.0
