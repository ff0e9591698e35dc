"""Level 3's judge measures the time the threads of the ranks on rank 0's host were runnable
against the ranks there x the threads each records (d500.training.cpu.Meter over
d500.distributed.jobtree's processes, the judge itself left out), as level 2's judge measures its
worker's (tests/training/test_entry_threads.py), its bound x Ranks.leeway: on real `mpiexec -n 2
d500 train --threads 1` ranks, an optimizer that starts threads of its own computing beside the
steps on every rank fails the run, and the same entry without it passes."""

from __future__ import annotations

import os
import sys

import pytest

from d500.distributed.judge import Ranks
from d500.training.cpu import bound
from tests.distributed import level3_jobs as jobs

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python"),
              pytest.mark.skipif(
                  sys.platform != "linux"
                  or not os.path.exists(f"/proc/self/task/{os.getpid()}/schedstat"),
                  reason="/proc's CPU times and schedstat")]

# From its first update on, D500_BESIDE threads compute on each rank (on rank D500_BESIDE_RANK
# alone where set), without pause (or D500_DUTY of the time): a stand-in for extra steps on
# cached batches, on cores the run does not record
GREEDY = '''
import os, threading, time
import torch
from d500.training.optimizers import Optimizer

_started = []


def _beside():
    a, duty = torch.ones(256, 256), float(os.environ.get("D500_DUTY", "1"))
    while True:
        t = time.perf_counter()
        a = a @ a / 256
        if duty < 1:
            time.sleep((time.perf_counter() - t) * (1 - duty) / duty)


class Greedy(Optimizer):
    name = "greedy"

    def update(self, ops, params, grads, state, lr, t):
        rank = os.environ["PMI_RANK"]
        if not _started and os.environ.get("D500_BESIDE_RANK", rank) == rank:
            for _ in range(int(os.environ.get("D500_BESIDE", "0"))):
                _started.append(threading.Thread(target=_beside, daemon=True))
                _started[-1].start()
            _started.append(None)
        ops.add_(params, grads, -lr)
'''


def _run(tmp_path, beside: bool, epochs: int = 1, **env: str) -> dict:
    """One job of digits-mlp at --threads 1 for `epochs` epochs (more than one: every one, its
    target out of reach)."""
    # (two threads on each rank: the judge's slack, 0.1 CPU s at the wait, is a short run's half)
    env = {"D500_BESIDE": "2", **env} if beside else {}
    home = tmp_path / "home"
    wl = jobs.workload(tmp_path, "digits-mlp", budget={"max_epochs": epochs},
                       **({"target": {"value": 0.999}} if epochs > 1 else {}))
    entry = jobs.entry(tmp_path, "sync", folder="greedy", files={"opt.py": GREEDY},
                       name="greedy", optimizer="opt.py:Greedy", hyperparameters={"lr": 0.1},
                       search_space={}, feasible_points=[])
    out = jobs.train(home, 2, wl, entry, "--seed", "0", "--threads", "1",
                     env=jobs.environment(home, **env))
    run = jobs.last_run(home)
    return {"out": out, "status": run["status"], "error": run["error"] or "",
            "cpu": run["details"].get("worker_cpu"),
            "ranks_cpu": run["details"].get("ranks_cpu"),
            "load": run["details"].get("load_average")}


@pytest.mark.slow  # one real 2-rank job of one digits epoch: ~12 s
def test_a_rank_computing_on_a_thread_of_its_own_fails_the_run(tmp_path):
    run = _run(tmp_path, beside=True)
    cpu = run["cpu"]
    assert cpu is not None, run["out"].stderr[-2000:]
    assert cpu["threads"] == 2, cpu  # 2 ranks here x 1 recorded thread each
    assert run["status"] == "failed", f"2 ranks x 1 thread recorded; they used {cpu}, {run}"
    assert cpu["bound"] == round(bound("torch") * Ranks.leeway, 3), cpu
    assert cpu["ratio"] > cpu["bound"] and "ranks on rank 0's host" in run["error"], run
    assert run["out"].returncode != 0


@pytest.mark.slow  # one real 2-rank job of one digits epoch: ~12 s
def test_ranks_on_their_recorded_threads_pass(tmp_path):
    run = _run(tmp_path, beside=False)
    cpu = run["cpu"]
    assert run["status"] in ("succeeded", "missed"), (run["error"], cpu, run["load"])
    assert cpu is not None and cpu["threads"] == 2 and 0 < cpu["ratio"], cpu
    assert cpu["runnable_s"] <= cpu["bound"] * cpu["threads"] * cpu["wall_s"] + cpu["slack_s"]
    assert sorted(run["ranks_cpu"]) == ["0", "1"], run["ranks_cpu"]  # each rank within, alone


@pytest.mark.slow  # one real 2-rank job of 24 digits epochs: ~25 s
def test_one_rank_computing_on_a_thread_of_its_own_fails_the_run(tmp_path):
    """Rank 1 alone on a thread of its own computing all the time, rank 0 honest: the ranks
    pooled read about (1.1 + 1.9) / 2, under the 1.625x bound, and the run passed (1.556x with
    the thread computing 3/4 of the time, 1.614x all of it); each rank is judged alone now. (24
    epochs, ~1.2 s worked: a rank may read d500.training.cpu.NOISE_S, 0.1 s, over its bound
    besides the slack, and over 12 epochs the thread at 4/5 of the time read 1.807x alone and
    passed by 0.016 s: an extra thread of a short run is within what honest ranks read.)"""
    run = _run(tmp_path, beside=True, epochs=24, D500_BESIDE="1", D500_BESIDE_RANK="1",
               D500_DUTY="1")
    cpu, each = run["cpu"], run["ranks_cpu"]
    assert cpu is not None and each is not None, run["out"].stderr[-2000:]
    assert sorted(each) == ["0", "1"] and {c["threads"] for c in each.values()} == {1}, each
    assert run["status"] == "failed", f"rank 1 ran 2 threads of the 1 recorded: {each}, {run}"
    assert each["1"]["ratio"] > each["1"]["bound"] and "rank 1" in run["error"], run
    assert run["out"].returncode != 0
