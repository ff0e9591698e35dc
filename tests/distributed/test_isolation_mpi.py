"""Level 3's entry code runs apart from the judge (d500.distributed.judge), on real `mpiexec -n 2`
ranks. One job runs an optimizer that halves its rank's clocks on import, sleeps 50 ms a step on
the real clock, and walks the stack and the heap of its rank for digits images: every rank finds
the training split and none of the held-out data, and no recorded time is halved; nor can it
read the memory of its judge or of any process above it through /proc. (Level 2's
twins, and the control showing that the search finds what a process holds, are in
tests/training/test_isolation.py.)"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import pytest

from d500.distributed import workloads
from d500.ledger import Ledger
from d500.training.data import dataset
from d500.training.data.splits import split
from tests.distributed import level3_jobs as jobs
from tests.training.test_isolation import CLOCK, PEEK, SNOOP, _hashes, _peeked

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")]

# SNOOP's search, in a file that also halves its process's clocks on import (CLOCK's prelude)
# and sleeps 50 ms a step: well above a loaded machine's compute for a step of this MLP; and
# that denies its CPU (DENY): its rank reports none while it spins SPIN_S CPU seconds at its
# first step, so that its own work would read as other processes' load (an idle machine loaded,
# reproduce's time tolerance wider) were the ranks' word taken for it
SPIN_S = 0.3
DENY = f"""
import d500.distributed.contention as _contention
_contention.process_cpu = lambda: 0.0
_spun = []


def _spin():
    end = sum(os.times()[:2]) + {SPIN_S}
    while not _spun and sum(os.times()[:2]) < end:
        pass
    _spun.append(1)
"""
STEP = "        ops.add_(params, grads, -lr)"
ATTACK = CLOCK.split("\n\nclass Slow")[0] + PEEK + SNOOP.replace(
    STEP, "        _spin()\n        _sleep(0.05)\n        if int(t) == 1:\n            _look()\n"
    + STEP) + DENY
assert "_sleep(0.05)" in ATTACK and "_spin()" in ATTACK


def test_two_ranks_find_no_held_out_data_and_their_halved_clocks_change_no_time(tmp_path):
    home = tmp_path / "home"
    found = tmp_path / "found.jsonl"
    out = jobs.attacked(tmp_path, ATTACK, "Snoop", D500_SNOOP=str(found),
                        D500_PEEK=str(tmp_path / "peek.jsonl"))
    assert out.returncode in (0, 1), out.stderr  # 1: the target missed in one epoch
    # the search: each rank looked twice, found its training split, and nothing held out
    parts = split(dataset.load("digits"), workloads.load(jobs.LEVEL3 / "digits-mlp.yaml")
                  .split_spec())
    train_rows = _hashes(parts.train.x)
    held_out = (_hashes(parts.validation.x) | _hashes(parts.test.x)) - train_rows
    looks = [set(json.loads(line)) for line in found.read_text().splitlines()]
    assert len(looks) == 4
    for seen in looks:
        assert len(seen & train_rows) >= len(train_rows) * 0.9
        assert seen & held_out == set()
    # the clocks: 37 steps of 50 ms each on every rank; at half speed about half of that
    ledger = Ledger(home / "ledger.sqlite")
    (run,) = ledger.runs()
    steps = ledger.evaluations(run["id"])[-1]["step"]
    assert steps == 1197 // 32
    assert run["figures"]["train_time"] >= steps * 0.05
    # the CPU: the ranks said they took none; the judge read it from /proc (both ranks' spins)
    details = ledger.get(run["id"])["details"]
    assert [r["cpu_seconds"] for r in details["ranks"]] == [0.0, 0.0]
    assert details["load_average"]["own_cpu"] >= 2 * SPIN_S - 0.05, details["load_average"]
    assert ledger.verify() == []
    # the memory: no rank could read its judge (rank 0's child) or any process above it
    peeked = [{pid: v for pid, v in look.items() if pid != "self"}
              for look in _peeked(tmp_path / "peek.jsonl")]
    assert len(peeked) == 2
    assert any(who == "child" for look in peeked for who, _ in look.values())  # the judge
    for look in peeked:
        assert all(what == "PermissionError" for _, what in look.values()), look


# Looks, as rank 0's entry file is imported (its build, right after it spawned its judge), at
# the judge's memory: a /proc/PID/mem opened while the judge was still starting (not yet
# shielded) would have stayed readable for the whole run
EARLY = PEEK + """
_found = {c: _peek(c) for c in _spawned()}
with open(_os.environ["D500_EARLY"], "a") as _out:
    _out.write(_json.dumps(_found) + "\\n")

from d500.training.optimizers.sgd import Momentum


class Early(Momentum):
    name = "early"
"""


def test_no_rank_runs_the_entrys_code_before_its_judge_is_shielded(tmp_path):
    early = tmp_path / "early.jsonl"
    out = jobs.attacked(tmp_path, EARLY, "Early", D500_EARLY=str(early))
    assert out.returncode in (0, 1), out.stderr
    looks = [json.loads(line) for line in early.read_text().splitlines()]
    judged = [what for look in looks for what in look.values()]
    assert judged, looks  # rank 0's import found its judge
    assert all(what == "PermissionError" for what in judged), looks


# Leaves, at each rank's first step, a process behind (a double fork, stdio closed, as a daemon
# does) that would edit the ledger after the job or load the machine during another run's timing
LEAVE = '''
import os, time
from d500.training.optimizers import Optimizer


class Leave(Optimizer):
    name = "leave"

    def update(self, ops, params, grads, state, lr, t):
        if int(t) == 1 and os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                with open(os.environ["D500_LEFT"], "a") as out:
                    out.write(os.readlink("/proc/self") + "\\n")  # its pid on the host
                time.sleep(600)
            os._exit(0)
        ops.add_(params, grads, -lr)
'''


def test_nothing_a_rank_starts_outlives_the_job(tmp_path):
    """Each rank runs behind a keeper (d500.children.keep, without a PID namespace of its own:
    its MPI peers read its memory by pid) that ends what it left behind as it ends; before, a
    rank's parent was hydra's proxy and the sleeper ran on after mpiexec returned."""
    left = tmp_path / "left.txt"
    out = jobs.attacked(tmp_path, LEAVE, "Leave", D500_LEFT=str(left))
    pids = [int(p) for p in left.read_text().split()] if left.exists() else []
    try:
        assert out.returncode in (0, 1), out.stderr  # 1: the target missed in one epoch
        assert len(pids) >= 2, (pids, out.stderr)  # a rank's warm-up and its run, each rank
        deadline = time.monotonic() + 5
        while (alive := [p for p in pids if _running(p)]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive, f"process(es) {alive} outlived the job"
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


ABORTED = '''
import os, sys, time
from d500 import children
children.keep(forward=True)  # as `d500 train` does on each rank (d500.distributed.cli)
children.confine()
from mpi4py import MPI
if MPI.COMM_WORLD.Get_rank() == 1:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(sys.argv[1] + ".new", "w") as out:
                out.write(os.readlink("/proc/self"))  # its pid on the host
            os.rename(sys.argv[1] + ".new", sys.argv[1])
            time.sleep(120)
        os._exit(0)
    time.sleep(60)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
MPI.COMM_WORLD.Abort(3)
'''


def test_nothing_a_rank_starts_outlives_an_aborted_job(tmp_path):
    """MPI_Abort: hydra SIGKILLs every process it started. A rank's keeper killed so left what
    the rank started (a double fork, its own session) running; the process hydra starts now only
    waits, and the rank's keeper, its child in a session of its own, outlives it and ends all."""
    import subprocess
    import sys
    mark = tmp_path / "left"
    out = subprocess.run([str(jobs.MPIEXEC), "-n", "2", sys.executable, "-c", ABORTED,
                          str(mark)], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    left = int(mark.read_text())
    try:
        assert out.returncode == 3, out.stderr
        deadline = time.monotonic() + 5
        while _running(left) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(left), f"process {left} outlived the aborted job"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(left, 9)
