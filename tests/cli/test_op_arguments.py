"""`d500 op` says a mistake of its command line before it loads the operator (a C operator
compiles, a Python one is imported in its host process): a mistyped backend, a bad --attr or
--input-shape, an unknown case name. The operator file here leaves a mark when imported."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("args, words", [
    (["bench", "{op}", "--backends", "torch,tensorflw"], "unknown backend 'tensorflw'"),
    (["validate", "{op}", "--input-shape", "8,a,3"], "--input-shape '8,a,3'"),
    (["validate", "{op}", "--input-shape", "4", "--attr", "alpha"], "--attr 'alpha'"),
    (["validate", "{op}", "--attr", "alpha=1"], "--attr needs --input-shape"),
    (["validate", "{op}", "--case", "no-such-case"], "no level-0 case named 'no-such-case'"),
    # level 0 calls its workloads cases (`--case FILE.yaml`): a missing file is named so, in full
    (["validate", "{op}", "--case", "nope.yaml"], "nope.yaml: no such case file in {dir}"),
    (["validate", "{op}", "--case", "{dir}"], "{dir}: a folder, where a level-0 case's file")])
def test_a_command_line_mistake_is_said_before_the_operator_loads(args, words, tmp_path):
    mark = tmp_path / "imported"
    (tmp_path / "my_op.py").write_text(f"open({str(mark)!r}, 'w').close()\n")
    args = [a.format(op=f"{tmp_path / 'my_op.py'}:MyRelu", dir=tmp_path) for a in args]
    words = words.format(dir=tmp_path)
    done = subprocess.run([sys.executable, "-m", "d500.cli", "op", *args], capture_output=True,
                          text=True, env={**os.environ, "D500_HOME": str(tmp_path / "home")},
                          cwd=tmp_path, timeout=120, check=False)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert words in done.stderr, done.stderr
    assert not mark.exists(), "the operator was loaded before the mistake was said"


CASE = """name: my-conv-5x5
level: 0
operator: Conv
dtype: float32
inputs: [[2, 4, 8, 8], {weights}]
attributes: {{pads: {pads}}}
metrics: [latency]
"""


@pytest.mark.parametrize("weights, pads, words", [
    ("[4, 3, 5, 5]", "[2, 2, 2, 2]", "the reference fails on this case"),  # 3 channels of 4
    ("[4, 4, 5, 5]", "[2, 2]", "the reference rejects these shapes/attributes")])
def test_a_case_the_reference_refuses_names_its_case_file(weights, pads, words, tmp_path):
    """It named only 'Conv(2x4x8x8, 4x3x5x5; pads=...)': which of the --case files is wrong?"""
    case = tmp_path / "my-conv-5x5.yaml"
    case.write_text(CASE.format(weights=weights, pads=pads))
    done = subprocess.run([sys.executable, "-m", "d500.cli", "op", "validate",
                           "numpy-im2col-conv", "--case", "my-conv-5x5.yaml"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
                          env={**os.environ, "D500_HOME": str(tmp_path / "home")})
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"d500 op: error: {case}: Conv(2x4x8x8, "), done.stderr
    assert words in done.stderr, done.stderr
