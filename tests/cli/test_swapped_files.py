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
