"""`d500 op validate|bench` as a user runs it: exit codes, ledger runs, the level-0 leaderboard."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from d500.ledger import Ledger

from .conftest import OPS, ROOT, d500

SMALL_CONV = ["--input-shape", "2,4,9,9", "--input-shape", "6,4,3,3", "--input-shape", "6",
              "--attr", "pads=1,1,1,1"]


def runs(home, **kw):
    ledger = Ledger(home / "ledger.sqlite")
    try:
        return ledger.runs(**kw)
    finally:
        ledger.close()


@pytest.mark.parametrize("entry, args, backend", [
    ("numpy-im2col-conv", ["--case", "levels/0-operators/conv-3x3-pad1.yaml"], "numpy"),
    ("c-gemm", [], "c"),
    ("torch-softmax", ["--case", "levels/0-operators/softmax-axis1.yaml"], "torch")])
def test_examples_validate_from_the_cli(home, entry, args, backend):
    out = d500("op", "validate", f"submissions/{entry}", *args, home=home)
    assert out.returncode == 0, out.stderr
    assert "verdict: PASS" in out.stdout and "FAIL" not in out.stdout
    recorded = runs(home, level=0)
    assert recorded and all(r["status"] == "succeeded" for r in recorded)
    assert {r["submission"] for r in recorded} == {entry}
    assert {r["backend"] for r in recorded} == {backend}
    assert all("forward_error" in r["figures"] and "gradient_error" in r["figures"]
               for r in recorded)
    if entry == "c-gemm":  # every Gemm case, since its submission.yaml names none
        assert {r["workload"] for r in recorded} == {
            "gemm-256", "gemm-small", "gemm-transb-alpha"}


@pytest.mark.parametrize("operator, args", [
    ("broken_conv.py:WrongGradientConv", SMALL_CONV),
    ("broken_conv.py:WrongPaddingConv", SMALL_CONV),
    ("broken_conv.py:OffByRelativeConv", SMALL_CONV),
    ("broken_softmax.py:WrongGradientSoftmax", ["--input-shape", "4,30"]),
    ("c_ops.py:LeakyCRelu", ["--input-shape", "3,40"])])
def test_broken_variants_exit_1(home, operator, args):
    out = d500("op", "validate", OPS / operator, *args, home=home)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "verdict: FAIL" in out.stdout
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("d500 op: error: 1 of 1 case(s) failed")
    assert "Traceback" not in out.stderr
    assert [r["status"] for r in runs(home, level=0)] == ["failed"]


@pytest.mark.parametrize("args, message", [
    (["op", "validate", "nosuch.py:Conv", "--input-shape", "1,2"], "nosuch.py: no such file"),
    (["op", "validate", "numpy-im2col-con"], "nor an example entry of that name ("),
    (["op", "validate", "numpy-im2col-con"], "did you mean 'numpy-im2col-conv'?"),
    (["op", "validate", "./nosuch-entry"], "no such file or folder; expected FILE.py:Class"),
    (["op", "validate", "submissions/numpy-im2col-conv/conv.py:NoSuch"], "no class 'NoSuch'"),
    (["op", "validate", "submissions/numpy-im2col-conv/conv.py:Im2colConv",
      "--input-shape", "2,x,3"], "--input-shape '2,x,3'"),
    (["op", "validate", "submissions/numpy-im2col-conv", "--input-shape", "1,3,8,8",
      "--input-shape", "4,2,3,3"], "the reference fails on this case"),
    (["op", "validate", "submissions/numpy-im2col-conv", "--input-shape", "1,3,8,8",
      "--input-shape", "4,3,3,3", "--attr", "pads"], "--attr 'pads'"),
    (["op", "validate", "tests/operators/ops/c_ops.py:LeakyCRelu", "--input-shape", "3",
      "--input-shape", "3"], " Relu takes exactly 1 input(s); 2 input shape(s) given (one "
                             "--input-shape per input)"),
    (["op", "validate", "submissions/numpy-im2col-conv", "--case",
      "levels/0-operators/relu-4d.yaml"], "a Relu case, but Im2colConv implements Conv"),
    (["op", "bench", "submissions/c-gemm", "--backends", "nosuch"], "unknown backend 'nosuch'"),
    (["op", "bench", "submissions/c-gemm", "--backends", ","], "--backends is empty"),
    (["op", "bench", "submissions/c-gemm", "--budget", "nan"], "positive number of seconds"),
    (["op", "validate", "submissions/c-gemm", "--seed", "-1"], "expected an integer >= 0"),
    (["op", "validate", "submissions/numpy-im2col-conv", "--input-shape", "1,3,8,8",
      "--input-shape", "4,3,3,3", "--attr", "colour=3"], "Conv has no attribute 'colour'"),
    (["op", "validate", "tests/operators/ops/c_ops.py:BrokenBuild", "--input-shape", "4"],
     "compiling does_not_compile.c failed")])
def test_bad_usage_exits_2_with_one_line(home, args, message):
    out = d500(*args, home=home)
    assert out.returncode == 2, out.stdout + out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("d500 op: error:") and message in last, out.stderr
    assert "Traceback" not in out.stderr
    assert not runs(home)  # nothing was recorded for a usage error


def test_compiler_output_is_shown(home):
    out = d500("op", "validate", "tests/operators/ops/c_ops.py:BrokenBuild", "--input-shape",
               "4", home=home)
    assert "undeclared_variable" in out.stderr and out.returncode == 2


@pytest.mark.slow
def test_examples_benchmark_and_show_on_the_level_0_leaderboard(home):
    benches = [("numpy-im2col-conv", "conv-3x3-stride2", "reference,onnxruntime"),
               ("c-gemm", "gemm-transb-alpha", "onnxruntime"),
               ("torch-softmax", "softmax-axis1", "torch")]
    for entry, case_, backends in benches:
        out = d500("op", "bench", f"submissions/{entry}", "--case",
                   f"levels/0-operators/{case_}.yaml", "--backends", backends, "--budget", "0.3",
                   home=home)
        assert out.returncode == 0, out.stderr
        assert "median" in out.stdout and "95% CI" in out.stdout and "IQR" in out.stdout
    recorded = runs(home, level=0)
    mine = {r["submission"]: r for r in recorded if r["submission"] != "builtin"}
    assert set(mine) == {"numpy-im2col-conv", "c-gemm", "torch-softmax"}
    for r in recorded:
        assert r["status"] == "succeeded" and r["figures"]["latency"] > 0
        if r["backend"] != "onnxruntime":  # inference only
            assert r["figures"]["backward_latency"] > 0
            assert r["details"]["backward_timing"]["median"] > 0
    conv = mine["numpy-im2col-conv"]["figures"]
    assert conv["gflops"] > 0
    if "peak_fraction" in conv:
        assert 0 < conv["peak_fraction"] < 100
    else:  # faster than the peak measured twice on a loaded machine: no fraction, and why
        assert "above the machine's peak" in mine["numpy-im2col-conv"]["details"]["timing"][
            "peak_note"]
    assert "gflops" not in mine["torch-softmax"]["figures"]  # Softmax has no FLOP formula
    assert {(r["workload"], r["backend"]) for r in recorded if r["submission"] == "builtin"} == {
        ("conv-3x3-stride2", "reference"), ("conv-3x3-stride2", "onnxruntime"),
        ("gemm-transb-alpha", "onnxruntime"), ("softmax-axis1", "torch")}
    board = d500("leaderboard", "--level", "0", home=home)
    assert board.returncode == 0, board.stderr
    for name in ("conv-3x3-stride2", "gemm-transb-alpha", "softmax-axis1", "numpy-im2col-conv",
                 "c-gemm", "torch-softmax", "builtin"):
        assert name in board.stdout


def test_failing_operator_is_benchmarked_as_failed_and_never_ranked(home):
    from d500.leaderboard import build
    out = d500("op", "bench", OPS / "broken_conv.py:OffByRelativeConv", "--case",
               ROOT / "levels/0-operators/conv-1x1.yaml", "--backends", "reference",
               "--budget", "0.2", "--json", home=home)
    assert out.returncode == 1
    (result,) = json.loads(out.stdout)
    rows = {r["submission"]: r for r in result["rows"]}
    assert rows["OffByRelativeConv"]["status"] == "failed"
    assert rows["OffByRelativeConv"]["timing"] is None
    assert rows["builtin"]["status"] == "ok" and rows["builtin"]["timing"]["median"] > 0
    statuses = {r["submission"]: r["status"] for r in runs(home, level=0)}
    assert statuses == {"OffByRelativeConv": "failed", "builtin": "succeeded"}
    ledger = Ledger(home / "ledger.sqlite")
    try:
        (board,) = build(ledger, level=0)
    finally:
        ledger.close()
    ranks = {e.submission: e.rank for e in board.entries}
    assert ranks == {"builtin": 1, "OffByRelativeConv": None}


def test_a_bench_killed_mid_way_leaves_its_runs_interrupted(home):
    proc = subprocess.Popen(
        [sys.executable, "-m", "d500.cli", "op", "bench", "submissions/c-gemm", "--case",
         "levels/0-operators/gemm-256.yaml", "--backends", "reference", "--budget", "60"],
        cwd=ROOT, env={**os.environ, "D500_HOME": str(home)}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if (home / "ledger.sqlite").is_file() and len(runs(home, status="running")) == 2:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the benchmark ended before its runs were seen running"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    recorded = runs(home, level=0)
    assert {(r["submission"], r["status"]) for r in recorded} == {
        ("c-gemm", "interrupted"), ("builtin", "interrupted")}
