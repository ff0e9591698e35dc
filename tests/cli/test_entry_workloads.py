"""A workload name mistyped in an entry's `workloads:` field gets the closest workload's name:
`d500 train digits-mlp` said only that the entry does not enter 'digits-mlp' (field
'workloads': digits-mpl), leaving the user to spot the typo."""

from __future__ import annotations

import os
import subprocess
import sys


def test_a_mistyped_workload_in_the_entry_gets_the_closest(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "submission.yaml").write_text(
        "name: mine\nlevel: 2\nworkloads: [digits-mpl]\noptimizer: sgd\nbatch_size: 32\n")
    done = subprocess.run([sys.executable, "-m", "d500.cli", "train", "digits-mlp",
                           "--submission", "./mine"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120, check=False,
                          env={**os.environ, "D500_HOME": str(tmp_path / "home")})
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "'digits-mpl' is no level-2 workload (did you mean 'digits-mlp'?)" in done.stderr
