"""`d500 conformance` says a mistyped operator before it imports the backend's framework (torch
took 5-9 s to import under load before `--op Rleu` was refused)."""

from __future__ import annotations

import os
import subprocess
import sys


def test_a_mistyped_operator_is_said_before_the_framework_loads(tmp_path):
    code = ("import sys; from d500.cli import main; rc = main(sys.argv[1:]); "
            "print(rc, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, "conformance", "--backend", "torch",
                           "--op", "Rleu"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "D500_HOME": str(tmp_path)}, check=False)
    assert done.stdout.strip() == "2 False", (done.stdout, done.stderr)
    assert "unknown operator(s) Rleu" in done.stderr and done.stderr.count("\n") == 1
