"""A run records the thread count d500 gave the worker (provenance "threads", chosen from the
machine's load or --threads), but the entry's code runs in that worker and may raise it: an
optimizer calling torch.set_num_threads(count + 1) (and widening its CPU affinity) trains on
more cores than the run says, on a machine where others' load made d500 give it fewer. No
setting stops it (a process may widen its own affinity): the judge measures the time the entry's
threads were runnable (ran or waited for a CPU: on a loaded machine CPU time alone falls with the
load) against the recorded threads x the time it worked, and fails the run over
d500.training.cpu's bound. The attack, performed on a real 'd500 train --threads 1' whatever the
load, its extra work on torch's threads or on short-lived threads of its own, and the same work
on the one thread the run records, which passes."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from d500.training.cpu import bound

from . import entries

GREEDY = '''
import json, os, threading
import torch
from d500.training.optimizers import Optimizer

BESIDE = []  # "short": the last thread started to compute beside the steps


def work(times=1):
    for _ in range(times):
        a = torch.ones(384, 384)
        a = a @ a / 384  # a stand-in for extra work (steps on cached batches) on those threads


class Greedy(Optimizer):
    name = "greedy"

    def update(self, ops, params, grads, state, lr, t):
        widen = os.environ.get("D500_WIDEN")
        if int(t) == 1 and widen:
            os.sched_setaffinity(0, range(os.cpu_count()))
            if widen == "pool":
                torch.set_num_threads(torch.get_num_threads() + 1)
        if int(t) == 5:
            with open(os.environ["D500_GREEDY"], "a") as out:
                out.write(json.dumps(torch.get_num_threads() + len(BESIDE)) + "\\n")
        if widen == "short" and not (BESIDE and BESIDE[-1].is_alive()):
            # one at a time, never waited on: it ends by itself, and its wait for a CPU with it
            BESIDE[:] = [threading.Thread(target=work, args=(3,))]
            BESIDE[0].start()
        work()
        ops.add_(params, grads, -lr)
'''


def _train(tmp_path: Path, widen: str) -> tuple[subprocess.CompletedProcess, list, dict]:
    """A 'd500 train --threads 1' of the entry; its output, the threads it said it trained on
    and its run's row (status, error, details)."""
    folder = entries.folder(tmp_path, GREEDY, "Greedy", name="greedy")
    said = tmp_path / "threads.jsonl"
    env = {**os.environ, "D500_HOME": str(tmp_path / "home"), "D500_GREEDY": str(said)}
    env.pop("D500_WIDEN", None)
    if widen:
        env["D500_WIDEN"] = widen
    done = subprocess.run([sys.executable, "-m", "d500.cli", "train", "digits-mlp",
                           "--submission", str(folder), "--threads", "1", "--seed", "0"],
                          cwd=entries.ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stderr
    used = [json.loads(line) for line in said.read_text().splitlines()]
    db = sqlite3.connect(tmp_path / "home" / "ledger.sqlite")
    status, error, details = db.execute("SELECT status, error, details FROM runs").fetchone()
    db.close()
    return done, used, {"status": status, "error": error or "", **json.loads(details)}


SCHEDSTAT = os.path.exists("/proc/self/task/%d/schedstat" % os.getpid())


@pytest.mark.slow  # (one 'd500 train' subprocess: 20 s at load 9, 45 s at load 13)
@pytest.mark.skipif(sys.platform != "linux" or len(os.sched_getaffinity(0)) < 2 or not SCHEDSTAT,
                    reason="/proc's CPU times and schedstat; more cores than the one recorded")
@pytest.mark.parametrize("widen", ["pool", "short"])
def test_an_entry_trains_on_the_threads_its_run_records(tmp_path, widen):
    """"pool": torch's threads raised; "short": a thread started beside the steps whenever the
    last one ended, each taking its wait for a CPU with it (charged from its CPU time)."""
    done, used, run = _train(tmp_path, widen=widen)
    assert used and used[-1] > 1, done.stderr  # the attack: it trained on more threads
    cpu, load = run["worker_cpu"], run["load_average"]
    assert run["status"] == "failed", f"the run records 1 thread; the entry used {cpu}, {load}"
    assert cpu["ratio"] > bound("torch") and "recorded thread" in run["error"], run
    if widen == "short":  # its threads' CPU time, not their own wait, read
        assert cpu["ended_s"] > 0 and cpu["ended_waited_s"] > 0, cpu


@pytest.mark.slow  # (one 'd500 train' subprocess: 25 s at load 9, 50 s at load 13)
@pytest.mark.skipif(sys.platform != "linux", reason="/proc's CPU times")
def test_the_same_work_on_the_recorded_thread_passes(tmp_path):
    done, used, run = _train(tmp_path, widen="")
    assert used == [1], done.stderr
    assert run["status"] in ("succeeded", "missed"), run["error"]
    cpu = run["worker_cpu"]
    assert cpu["threads"] == 1 and 0 < cpu["ratio"], cpu
    assert cpu["runnable_s"] <= cpu["bound"] * cpu["wall_s"] + cpu["slack_s"], cpu


BESIDE = '''
import os, threading, time
import numpy as np
from d500.training.optimizers import Optimizer

BESIDE = []


def work():
    """A stand-in for extra work (steps on cached batches) on a thread of its own, busy for
    D500_SHARE of its time."""
    a, share = np.ones((256, 256), np.float32), float(os.environ["D500_SHARE"])
    while True:
        began = time.perf_counter()
        a = a @ a / 256
        time.sleep((time.perf_counter() - began) * (1 - share) / share)


class Beside(Optimizer):
    name = "beside"

    def update(self, ops, params, grads, state, lr, t):
        if not BESIDE:  # traced (jax.jit, tf.function): it runs once, its thread from then on
            BESIDE.append(threading.Thread(target=work, daemon=True))
            BESIDE[0].start()
        ops.add_(params, grads, -lr)
'''


@pytest.mark.slow  # (one 'd500 train' subprocess: ~20 s at load 7)
@pytest.mark.skipif(sys.platform != "linux" or len(os.sched_getaffinity(0)) < 2 or not SCHEDSTAT,
                    reason="/proc's CPU times and schedstat; more cores than the one recorded")
@pytest.mark.parametrize("backend,share", [("jax", "1"), ("tensorflow", "0.6")])
def test_an_entry_computing_beside_a_traced_step_fails(tmp_path, backend, share):
    """The optimizer's update runs once, when jax.jit or tf.function traces the step: there it
    starts a thread of its own computing beside the steps (jax: all the time; tensorflow: 0.6
    of it) in a run recorded at --threads 1. Under the bounds these frameworks had (jax 4x:
    XLA's compile pool and async dispatch thread made an honest run read ~1.9; tensorflow 2x)
    it passed (jax 2.45-2.72x, tensorflow 2.06-2.28x within the slack); now each fails."""
    folder = entries.folder(tmp_path, BESIDE, "Beside", name="beside")
    env = {**os.environ, "D500_HOME": str(tmp_path / "home"), "D500_SHARE": share}
    done = subprocess.run([sys.executable, "-m", "d500.cli", "train", "digits-mlp",
                           "--submission", str(folder), "--backend", backend, "--threads", "1",
                           "--seed", "0"],
                          cwd=entries.ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stderr
    db = sqlite3.connect(tmp_path / "home" / "ledger.sqlite")
    status, error, details = db.execute("SELECT status, error, details FROM runs").fetchone()
    db.close()
    cpu = json.loads(details)["worker_cpu"]
    assert cpu["bound"] == bound(backend) and cpu["threads"] == 1, cpu
    assert status == "failed" and "recorded thread" in error, (cpu, done.stderr[-2000:])
    assert cpu["ratio"] > bound(backend), cpu
