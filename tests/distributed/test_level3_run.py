"""`d500 run`'s level-3 stage: the plug-in plans the example entries on digits-mlp at 2 ranks and
executes one by starting `mpiexec -n 2` from the venv's MPICH; the child ranks' rank 0 records the
run into the same ledger ($D500_HOME inherited)."""

from __future__ import annotations

import pytest

from d500 import levels
from d500.ledger import Ledger
from d500.levels import Context, RunOptions
from tests.distributed import level3_jobs as jobs


def test_the_plan_is_the_run_entries_on_digits_mlp_at_2_ranks():
    level = levels.get(3)
    items = level.plan(RunOptions())
    assert [i.label for i in items] == [
        "ddp-baseline on digits-mlp at 2 ranks", "sync on digits-mlp at 2 ranks",
        "sync-powersgd on digits-mlp at 2 ranks"]
    assert [i.label for i in level.plan(RunOptions(quick=True))] == [
        "sync on digits-mlp at 2 ranks", "sync-powersgd on digits-mlp at 2 ranks"]
    assert level.plan(RunOptions(backends=["tensorflow"])) == []
    assert level.plan(RunOptions(workloads=["squeezenet"])) == []  # another level's workload


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")
def test_executing_an_item_starts_mpiexec_and_records_into_the_same_ledger(tmp_path,
                                                                          monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("D500_HOME", str(home))
    level = levels.get(3)
    item = level.plan(RunOptions(quick=True))[0]
    logged: list[str] = []
    outcome = level.execute(item, Context(ledger=Ledger(), log=logged.append))
    assert outcome.problems == [], outcome.problems
    assert outcome.summary.startswith("sync on digits-mlp at 2 ranks: run 1 succeeded")
    assert any("mpiexec -disable-auto-cleanup -n 2" in line for line in logged)
    run = Ledger().get(1)
    assert (run["status"], run["world_size"], run["submission"]) == ("succeeded", 2, "sync")
