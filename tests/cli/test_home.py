"""An empty D500_HOME (`D500_HOME= d500 ...`, `D500_HOME=$UNSET`) is the default results
folder ./d500-results, as unset is: it was the current folder, which took the ledger and the
caches among the user's own files."""

from __future__ import annotations

import os
import subprocess
import sys


def test_an_empty_d500_home_is_the_default_results_folder(tmp_path):
    done = subprocess.run([sys.executable, "-m", "d500.cli", "ledger", "list"],
                          capture_output=True, text=True, env={**os.environ, "D500_HOME": ""},
                          cwd=tmp_path, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert f"{tmp_path / 'd500-results' / 'ledger.sqlite'}" in done.stdout, done.stdout
    assert not (tmp_path / "ledger.sqlite").exists()
