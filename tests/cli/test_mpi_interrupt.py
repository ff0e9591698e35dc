"""Ctrl-C typed at the terminal of `mpiexec -n 2 d500 train` while rank 0's start-up spinner
turns: mpiexec prints its own notice before any rank hears of it, and that notice ran on after
the spinner's text on one line ('... starting each rank's worker 0:00:04^C[mpiexec@vm] Sending
Ctrl-C ...'). Typed for real: a pseudo-terminal that is mpiexec's controlling terminal."""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from tests.terminal import screen

MPIEXEC = Path(sys.executable).with_name("mpiexec")


def typed_ctrl_c(command: list[str], env: dict, cwd: Path, after: bytes) -> tuple[int, str]:
    """Run `command` on a pseudo-terminal of 200 columns that is its controlling terminal, type
    Ctrl-C once its output holds `after`: (exit code, all it wrote, the echoed '^C' included).
    Where it has not ended 60 s after, a second Ctrl-C (mpiexec's forced abort) ends it, and
    that fails."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))

    def own_terminal() -> None:  # a session of its own, led by it: the pty its terminal
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd,
                            preexec_fn=own_terminal)
    os.close(slave)
    out, typed, hung = b"", None, None
    started = time.monotonic()
    while True:
        now = time.monotonic()
        if typed is None and after in out:
            time.sleep(0.2)  # (rank 1, started beside rank 0, past Python's own start-up)
            os.write(master, b"\x03")  # the terminal echoes ^C and signals mpiexec's group
            typed = now
        if hung is None and now - (typed or started) > 60:
            os.write(master, b"\x03")  # mpiexec's forced abort: ends what waits
            hung = now
        if hung is not None and now - hung > 30:
            proc.kill()
            break
        if select.select([master], [], [], 0.1)[0]:
            try:
                data = os.read(master, 65536)
            except OSError:  # every writer gone
                break
            if not data:
                break
            out += data
    os.close(master)
    code = proc.wait(timeout=60)
    text = out.decode(errors="replace")
    assert typed is not None and hung is None, text
    return code, text


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.skipif(not MPIEXEC.exists(), reason="no mpiexec beside Python")
def test_mpiexecs_ctrl_c_notice_starts_a_clean_line(tmp_path):
    env = {**os.environ, "D500_HOME": str(tmp_path), "TERM": "xterm"}
    env.pop("COLUMNS", None)
    command = [str(MPIEXEC), "-n", "2", sys.executable, "-m", "d500.cli", "train", "digits-mlp",
               "--submission", "sync"]
    code, out = typed_ctrl_c(command, env, tmp_path, after=b"d500 train: ")
    assert code != 0, out
    lines = [line for line in screen(out) if line.strip()]
    notice = [line for line in lines if "Sending Ctrl-C" in line]
    assert notice, lines
    assert notice[0].startswith(("^C[", "[")), lines  # not after the spinner's text
    assert not any("d500 train: " in line and "0:00:" in line for line in lines), lines  # gone
    assert any(re.fullmatch(r"\[rank [01]\] d500 train: interrupted", line) for line in lines), \
        lines  # (the first rank to end the job may end the other before it says so)
    assert not any(line.startswith("Abort(") for line in lines), lines  # MPICH's: not said


def test_a_long_step_is_cut_before_its_clock_and_the_cursor_waits_at_the_lines_start():
    """Cut to the width given (LAUNCHER_WIDTH under mpiexec), the elapsed time kept; each frame
    ends at the line's start, where another's line writes over it."""
    from d500.progress import _DRAW, LAUNCHER_WIDTH
    done = subprocess.run([sys.executable, "-c", _DRAW, str(LAUNCHER_WIDTH), "ascii"],
                          input=b"x" * 300 + b"\n", capture_output=True, timeout=60, check=True)
    frames = done.stderr.decode().split("\r\x1b[2K")[1:-1]
    assert frames and all(f.endswith(" 0:00:00\r") for f in frames), frames
    shown = [f.replace("\x1b[32m", "").replace("\x1b[0m", "") for f in frames]
    assert all(len(f.rstrip("\r")) <= LAUNCHER_WIDTH - 1 for f in shown), shown
    assert LAUNCHER_WIDTH - 1 <= len("^C[mpiexec@H] Sending Ctrl-C to processes as requested")
