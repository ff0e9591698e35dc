"""An operator class a new user gets wrong is said at load, in one line: a framework mistyped
gets the closest name, and a Python operator without forward is a usage error (exit 2) instead
of failing every case as the operator's own fault (exit 1, 'forward raised
NotImplementedError')."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from d500.errors import UsageError
from d500.operators import CustomOperator
from d500.operators.base import check_class


def test_a_mistyped_framework_gets_the_closest():
    class Typo(CustomOperator):
        op_type, framework = "Relu", "numpi"

        def forward(self, x):
            return x
    with pytest.raises(UsageError, match=r"did you mean 'numpy'\?"):
        check_class(Typo, "my_op.py")


def test_an_operator_without_forward_is_a_usage_error(tmp_path):
    (tmp_path / "my_op.py").write_text(
        "from d500.operators import CustomOperator\n\n\n"
        "class NoForward(CustomOperator):\n    op_type = 'Relu'\n    framework = 'numpy'\n")
    done = subprocess.run([sys.executable, "-m", "d500.cli", "op", "validate",
                           "my_op.py:NoForward", "--input-shape", "4,5"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=300, check=False,
                          env={**os.environ, "D500_HOME": str(tmp_path / "home")})
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "NoForward defines no forward" in done.stderr
