"""A ^C while a level-2 run's worker starts (a terminal's SIGINT reaches the whole process
group) ends `d500 train` with its one line, exit 130, the run recorded as interrupted: the
spawned worker (d500's default start), or the forkserver (D500_WORKER_START=forkserver) as it
preloaded torch, took it in its own imports and printed their traceback under that line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import seed_peak

ROOT = Path(__file__).resolve().parents[2]
# `d500` as a terminal's shell starts it: ^C at its default, unblocked, whatever this test
# process inherited or was left with (an xdist worker: the job inherits its disposition and mask)
D500 = ("import runpy, signal, sys; signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
        "signal.signal(signal.SIGINT, signal.default_int_handler); sys.argv[0] = 'd500'; "
        "runpy.run_module('d500.cli', run_name='__main__')")


def _child(parent: int, mark: bytes) -> int | None:
    """The child of `parent` whose command line holds `mark`, once it exists."""
    for proc in Path("/proc").iterdir():
        try:
            parent_of = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if parent_of == parent and mark in (proc / "cmdline").read_bytes():
                return int(proc.name)
        except (OSError, ValueError, IndexError):
            continue
    return None


@pytest.mark.parametrize("start, mark", [("spawn", b"spawn_main"),
                                         ("forkserver", b"forkserver import main")])
def test_a_ctrl_c_as_the_worker_starts_is_one_line(tmp_path, start, mark):
    home = tmp_path / "home"
    seed_peak(home)
    env = {**os.environ, "D500_HOME": str(home), "TF_CPP_MIN_LOG_LEVEL": "3",
           "D500_WORKER_START": start}
    job = subprocess.Popen(
        [sys.executable, "-c", D500, "train", "digits-mlp", "--submission", "adamw",
         "--backend", "reference", "--seed", "0"], env=env, cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while _child(job.pid, mark) is None and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert job.poll() is None, job.communicate()
        time.sleep(0.2)  # inside its start-up: its interpreter's and NumPy's (torch's) imports
        os.killpg(job.pid, signal.SIGINT)  # as a terminal's ^C: every process of the group
        out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert job.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip().splitlines()[-1] == "d500 train: interrupted", err
    listed = subprocess.run([sys.executable, "-m", "d500.cli", "ledger", "list", "--json"],
                            env=env, capture_output=True, text=True, timeout=120, check=True)
    assert [r["status"] for r in json.loads(listed.stdout)] == ["interrupted"]
