"""`d500 reference --entry` mistyped gets the closest example entry, as --submission does (it
listed the 30 example entries with no hint)."""

from __future__ import annotations

import os
import subprocess
import sys


def test_a_mistyped_reference_entry_gets_the_closest(tmp_path):
    done = subprocess.run([sys.executable, "-m", "d500.cli", "reference", "digits-mlp",
                           "--entry", "sgd-momentun"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120, check=False,
                          env={**os.environ, "D500_HOME": str(tmp_path / "home")})
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("d500 reference: error: --entry sgd-momentun: ")
    assert "did you mean 'sgd-momentum'?" in done.stderr, done.stderr
