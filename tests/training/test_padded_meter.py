"""The CPU a worker's threads used is judged against the recorded threads x the time the worker
worked (d500.training.cpu), and the worker's last answer, the finish after the run's last
evaluation, is in no figure: were its time counted as worked, an entry could train on more
threads than recorded and then wait in the finish as long as it trained, halving its ratio at no
cost to its time to accuracy. The attack, performed on a real 'd500 train --threads 1': the
entry of tests/training/test_entry_threads.py on torch's threads raised ("pool"), sleeping at
the finish twice the time from its data to it. The meter reads the worker before that finish."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest

from d500.training.cpu import bound

from . import entries
from .test_entry_threads import GREEDY, SCHEDSTAT

PAD = GREEDY + '''

import time
from multiprocessing import connection

_recv = connection.Connection.recv
_since = []


def _padded(self):
    message = _recv(self)
    if isinstance(message, tuple) and message and message[0] == "data":
        _since.append(time.perf_counter())
    if isinstance(message, tuple) and message[:2] == ("finish", False) and _since:
        time.sleep(2 * (time.perf_counter() - _since[0]))  # worked, idle, off the clock
    return message


if not hasattr(connection.Connection, "_padded"):  # (the file may be imported twice)
    connection.Connection._padded = True
    connection.Connection.recv = _padded
'''


@pytest.mark.slow  # (one 'd500 train' subprocess: ~20-45 s at load 9-13)
@pytest.mark.skipif(sys.platform != "linux" or len(os.sched_getaffinity(0)) < 2 or not SCHEDSTAT,
                    reason="/proc's CPU times and schedstat; more cores than the one recorded")
def test_an_entry_waiting_in_its_finish_does_not_dilute_its_threads(tmp_path):
    folder = entries.folder(tmp_path, PAD, "Greedy", name="padded")
    said = tmp_path / "threads.jsonl"
    env = {**os.environ, "D500_HOME": str(tmp_path / "home"), "D500_GREEDY": str(said),
           "D500_WIDEN": "pool"}
    done = subprocess.run([sys.executable, "-m", "d500.cli", "train", "digits-mlp",
                           "--submission", str(folder), "--threads", "1", "--seed", "0"],
                          cwd=entries.ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stderr
    used = [json.loads(line) for line in said.read_text().splitlines()]
    assert used and used[-1] > 1, done.stderr  # the attack: it trained on more threads
    db = sqlite3.connect(tmp_path / "home" / "ledger.sqlite")
    status, error, details = db.execute("SELECT status, error, details FROM runs").fetchone()
    db.close()
    cpu = json.loads(details)["worker_cpu"]
    assert status == "failed", f"the run records 1 thread; the entry used {cpu}"
    assert cpu["ratio"] > bound("torch") and "recorded thread" in error, (error, cpu)
