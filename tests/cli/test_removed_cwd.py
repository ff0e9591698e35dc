"""A command run from a folder removed since the shell entered it (`rm -rf` of the folder one
stands in) says so in one line: the default results folder ./d500-results, a relative path,
ended in a FileNotFoundError traceback."""

from __future__ import annotations

import os
import subprocess
import sys


def test_a_removed_current_folder_is_one_line(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    code = (f"import os, sys; os.chdir({str(gone)!r}); os.rmdir({str(gone)!r}); "
            "from d500.cli import main; sys.exit(main(['ledger', 'list']))")
    env = {k: v for k, v in os.environ.items() if k != "D500_HOME"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr == ("d500 ledger: error: the current folder no longer exists (removed "
                           "since the shell entered it): cd into a folder that does\n")
