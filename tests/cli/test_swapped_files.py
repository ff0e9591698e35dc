"""The workload and the entry given the other way round are said so: an entry's submission.yaml
given as the workload read 'unknown field authors', a workload file given as the entry
'unknown field model', neither saying what the file was."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from d500.paths import examples, rulebook


@pytest.mark.parametrize("args, words", [
    (["{entry}", "--submission", "{entry}"],
     "submission.yaml: an entry's submission.yaml (field 'workloads'), where a workload file "
     "is expected"),
    (["digits-mlp", "--submission", "{workload}"],
     "digits-mlp.yaml: a workload file (field 'metrics'), where an entry's submission.yaml is "
     "expected")])
def test_a_workload_and_an_entry_swapped_are_said_so(args, words, tmp_path):
    args = [a.format(entry=examples() / "sgd-momentum" / "submission.yaml",
                     workload=rulebook() / "2-training" / "digits-mlp.yaml") for a in args]
    done = subprocess.run([sys.executable, "-m", "d500.cli", "train", *args],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          check=False, env={**os.environ, "D500_HOME": str(tmp_path / "home")})
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert words in done.stderr, done.stderr


@pytest.mark.parametrize("args, words", [
    (["train", "digits-mlp", "--submission", "my_opt.py"],  # its YAML error, at line 1
     "my_opt.py: not an entry (a folder holding submission.yaml, or that file); its optimizer "
     "file is named there: optimizer: my_opt.py:Class"),
    (["train", "digits-mlp", "--submission", "m.onnx"],  # 'not a text file'
     "m.onnx: not an entry (a folder holding submission.yaml, or that file)"),
    (["op", "validate", "my-case.yaml"],  # a case file given as the operator
     "'my-case.yaml': a YAML file where the operator goes (FILE.py:Class or a submission "
     "folder); a case file goes after --case")])
def test_a_file_of_another_kind_given_as_the_entry_is_said_so(args, words, tmp_path):
    (tmp_path / "my_opt.py").write_text("import numpy as np\n\nclass MyOpt:\n    pass\n")
    (tmp_path / "m.onnx").write_bytes(b"\x08\x07\x12\x04d500")
    (tmp_path / "my-case.yaml").write_text("name: my-case\nlevel: 0\noperator: Relu\n")
    done = subprocess.run([sys.executable, "-m", "d500.cli", *args], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120, check=False,
                          env={**os.environ, "D500_HOME": str(tmp_path / "home")})
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.endswith(f"error: {words}\n"), done.stderr
