"""`d500 run` waits for a quiet machine before each level (--quiet-wait, 60 s by default); on a
terminal its bar says so, but a log or a pipe sees no bar and was told nothing for up to a minute
per level: there the wait is said once, as a line."""

from __future__ import annotations

import os
import subprocess
import sys

WAIT = """
from rich.console import Console
from d500 import runner
err = Console(stderr=True)
with runner._progress(err) as progress:
    stage = progress("level 0: operators", 1)
    runner._quiet(1.5, stage, err)  # a reading takes 1 s: the wait is said after the first
"""


def test_a_wait_for_a_quiet_machine_is_said_in_a_pipe(tmp_path):
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # another's process
    try:
        done = subprocess.run([sys.executable, "-c", WAIT], capture_output=True, text=True,
                              timeout=120, check=False, cwd=tmp_path,
                              env={**os.environ, "D500_LOADED_SHARE": "0"})  # any load counts
    finally:
        busy.kill()
        busy.wait()
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines()
            if line.startswith("level 0: operators: waiting for a quiet machine: other "
                               "processes take ")]  # (the bar's last state is drawn at the end)
    assert len(said) == 1, done.stderr  # once, however long it waits
