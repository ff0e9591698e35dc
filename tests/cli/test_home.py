"""An empty D500_HOME (`D500_HOME= d500 ...`, `D500_HOME=$UNSET`) is the default results
folder ./d500-results, as unset is: it was the current folder, which took the ledger and the
caches among the user's own files."""

from __future__ import annotations

import os
import subprocess
import sys

from d500.ledger import Ledger


def test_an_empty_d500_home_is_the_default_results_folder(tmp_path):
    def listed():
        return subprocess.run([sys.executable, "-m", "d500.cli", "ledger", "list"],
                              capture_output=True, text=True, env={**os.environ, "D500_HOME": ""},
                              cwd=tmp_path, timeout=120, check=False)
    missing = listed()  # nothing there yet: said, and nothing made
    assert missing.returncode == 2 and missing.stderr == (
        f"d500 ledger: error: no ledger at {tmp_path / 'd500-results' / 'ledger.sqlite'}: the "
        f"default home ./d500-results ($D500_HOME is empty) does not exist; check the path, or "
        f"record runs first (d500 run, d500 train, d500 op bench ...)\n"), missing.stderr
    assert list(tmp_path.iterdir()) == []
    Ledger(tmp_path / "d500-results" / "ledger.sqlite").close()
    done = listed()
    assert done.returncode == 0, done.stderr
    assert f"{tmp_path / 'd500-results' / 'ledger.sqlite'}" in done.stdout, done.stdout
    assert not (tmp_path / "ledger.sqlite").exists()
