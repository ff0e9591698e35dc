"""--debug adds the traceback to a user mistake and changes nothing else: the same line last and
the same exit code 2 (it exited 1, a failed check's code, so a script telling the two apart
read a usage error as a failed check)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("how", [["--debug"], []])
def test_debug_shows_the_traceback_and_keeps_the_line_and_exit_code(how, tmp_path):
    from d500.ledger import Ledger
    Ledger(tmp_path / "ledger.sqlite").close()  # an empty ledger: run 99 is not in it
    env = {**os.environ, "D500_HOME": str(tmp_path)}
    if not how:
        env["D500_DEBUG"] = "1"
    done = subprocess.run([sys.executable, "-m", "d500.cli", *how, "ledger", "show", "99"],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("Traceback"), done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("d500 ledger: error: no run 99 ")
