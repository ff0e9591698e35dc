"""d500.progress's spinner turns while the command's interpreter is held (a framework's import,
a long call into C: TensorFlow's import stood rich's spinner thread still for 3-5 s), draws every
step, and leaves its line clear."""

from __future__ import annotations

import os
import sys
import time

from tests.terminal import on_terminal, screen

HELD = """
import sys, time
from d500 import progress
with progress.shown("title"):
    progress.step("quick")
    progress.step("held")
    sys.setswitchinterval(30)  # no other thread of this process runs until the loop ends
    end = time.monotonic() + 2
    while time.monotonic() < end:
        pass
sys.stderr.write("after\\n")
"""


def test_the_spinner_turns_while_the_interpreter_is_held(tmp_path):
    started = time.monotonic()
    code, _, err = on_terminal([sys.executable, "-c", HELD], {**os.environ, "COLUMNS": "120"},
                               tmp_path)
    assert code == 0, err
    assert time.monotonic() - started < 30
    assert "title: quick" in err, err  # drawn, though the next step followed at once
    held = err.count("title: held")
    assert held >= 5, err  # a frame every 0.1 s of the 2 s; a thread drew one at most
    assert [line for line in screen(err) if line.strip()] == ["after"], err


def test_a_dumb_terminal_gets_no_spinner(tmp_path):
    """TERM=dumb (Emacs' shell) shows escapes as text: the spinner's would fill the screen."""
    code, _, err = on_terminal([sys.executable, "-c", HELD.replace("+ 2", "+ 0.3")],
                               {**os.environ, "TERM": "dumb"}, tmp_path)
    assert code == 0 and err == "after\r\n", err


STOPPED = """
import os, signal, sys
from d500 import progress
progress.DRAWER_WAIT = 0.3
with progress.shown("title"):
    progress.step("drawn")
    import time; time.sleep(0.5)
    kids = open(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read().split()
    os.kill(int(kids[0]), signal.SIGSTOP)  # a drawer that never gets the CPU again
sys.stderr.write("after\\n")
"""


def test_a_drawer_that_never_ends_is_killed_and_its_line_erased(tmp_path):
    code, _, err = on_terminal([sys.executable, "-c", STOPPED], dict(os.environ), tmp_path)
    assert code == 0 and "title: drawn" in err, err
    assert [line for line in screen(err) if line.strip()] == ["after"], err
