"""`d500 run` says what it does before its first progress bar: planning every level's runs
(level 0 loads each example operator in its own process) and loading every framework to set
its threads took ~11 s at load 6 with nothing on the terminal."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time


def test_d500_run_shows_its_set_up_on_a_terminal(tmp_path):
    env = {**os.environ, "D500_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    master, slave = os.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "d500.cli", "run", "--level", "0",
                             "--quick", "--quiet-wait", "0", "--no-html"],
                            stdout=subprocess.DEVNULL, stderr=slave, env=env, cwd=tmp_path,
                            start_new_session=True)
    os.close(slave)
    seen = b""
    try:
        deadline = time.monotonic() + 120
        while b"d500 run: planning each level's runs" not in seen and \
                b"level 0: operators" not in seen and time.monotonic() < deadline:
            try:
                seen += os.read(master, 65536)
            except OSError:  # it ended
                break
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # as ^C: d500 ends what it started
        # the terminal read on as it ends, as a terminal does: a pty nobody reads fills with
        # the spinner's frames (~4 KB) and blocks its writers, and d500 never ended (the whole
        # wait, 120 s, in a fresh clone's make test)
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if select.select([master], [], [], 0.1)[0]:
                try:
                    os.read(master, 65536)
                except OSError:
                    pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        os.close(master)
    assert proc.returncode == 130, f"^C ended d500 run with {proc.returncode}"
    text = seen.decode(errors="replace")
    assert "d500 run: planning each level's runs" in text, text
    assert "level 0: operators" not in text.split("planning each level's runs")[0], text
