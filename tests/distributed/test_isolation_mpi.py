"""Level 3's entry code runs apart from the judge (d500.distributed.judge), on real `mpiexec -n 2`
ranks: an optimizer that walks the stack and the heap of every rank finds the training split and
none of the held-out data, and one that halves the ranks' clocks on import changes no recorded
time. (Level 2's twins, and the controls that show the search finds what a process holds, are in
tests/training/test_isolation.py.)"""

from __future__ import annotations

import json

import pytest

from d500.distributed import workloads
from d500.ledger import Ledger
from d500.training.data import dataset
from d500.training.data.splits import split
from tests.distributed import level3_jobs as jobs
from tests.training.test_isolation import CLOCK, SNOOP, _hashes

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")]


def _attack(tmp_path, code: str, cls: str):
    return jobs.entry(tmp_path, "sync", folder="attack", files={"opt.py": code}, name="attack",
                      optimizer=f"opt.py:{cls}", hyperparameters={"lr": 0.1}, search_space={},
                      feasible_points=[])


def test_two_ranks_searching_the_stack_and_heap_find_no_held_out_data(tmp_path):
    home = tmp_path / "home"
    found = tmp_path / "found.jsonl"
    wl = jobs.workload(tmp_path, "digits-mlp", budget={"max_epochs": 1})
    out = jobs.train(home, 2, wl, _attack(tmp_path, SNOOP, "Snoop"), "--seed", "0",
                     env=jobs.environment(home, D500_SNOOP=str(found)))
    assert out.returncode in (0, 1), out.stderr  # 1: the target missed in one epoch
    parts = split(dataset.load("digits"), workloads.load(wl).split_spec())
    train_rows = _hashes(parts.train.x)
    held_out = (_hashes(parts.validation.x) | _hashes(parts.test.x)) - train_rows
    looks = [set(json.loads(line)) for line in found.read_text().splitlines()]
    assert len(looks) == 4  # two looks on each of two ranks
    for seen in looks:
        assert len(seen & train_rows) >= len(train_rows) * 0.9  # each rank holds the split
        assert seen & held_out == set()


def test_ranks_patching_their_clocks_on_import_do_not_change_the_recorded_times(tmp_path):
    home = tmp_path / "home"
    wl = jobs.workload(tmp_path, "digits-mlp", budget={"max_epochs": 2})
    slow = CLOCK.replace("_sleep(0.01)", "_sleep(0.05)")  # well above a loaded step's compute
    out = jobs.train(home, 2, wl, _attack(tmp_path, slow, "Slow"), "--seed", "0")
    assert out.returncode in (0, 1), out.stderr
    ledger = Ledger(home / "ledger.sqlite")
    (run,) = ledger.runs()
    steps = ledger.evaluations(run["id"])[-1]["step"]  # every rank sleeps 50 ms a step
    assert steps >= 37  # at least the first epoch of global batches of 32
    assert run["figures"]["train_time"] >= steps * 0.05  # at half speed: about half of that
    assert ledger.verify() == []
