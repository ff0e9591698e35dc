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
        # the terminal read on as it ends, as a terminal does (a pty nobody reads fills with
        # the spinner's frames and blocks its writers); killed after 10 s, how ^C ends it not
        # judged here: in two fresh clones' make test (2026-11-28) the run went on after it,
        # 120 s till killed, then 84 s to its level's end with exit 0, unexplained; alone it
        # ends at once, exit 130
        deadline = time.monotonic() + 10
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
    text = seen.decode(errors="replace")
    assert "d500 run: planning each level's runs" in text, text
    assert "level 0: operators" not in text.split("planning each level's runs")[0], text
