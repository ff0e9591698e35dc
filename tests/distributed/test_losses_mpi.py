"""The training loss a level-3 run records with each evaluation is the loss over the global batch
(the ranks' losses weighted by their shares), not rank 0's share alone: sync at 2 ranks records
what 1 rank records for the same seed and global batch (issue 20, item 10)."""

from __future__ import annotations

import numpy as np
import pytest

from d500.distributed.loop import _global_losses
from d500.ledger import Ledger
from tests.distributed import level3_jobs as jobs


def test_losses_weighted_by_share_and_the_first_bad_rank_named():
    every = np.array([[[1.0, 2.0, 3.0], [16, 16, 17]],     # rank 0: losses, share sizes
                      [[3.0, np.nan, 5.0], [16, 16, 16]]])  # rank 1: non-finite at step 1
    losses, where = _global_losses(every)
    assert losses[0] == 2.0 and np.isnan(losses[1]) and len(losses) == 2 and where == " on rank 1"
    losses, where = _global_losses(every[:, :, [0, 2]])
    assert losses == [2.0, (3.0 * 17 + 5.0 * 16) / 33] and where == ""


@pytest.mark.mpi
@pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")
def test_two_ranks_record_the_global_batchs_training_loss(tmp_path):
    home = tmp_path / "home"
    wl = jobs.workload(tmp_path, "digits-mlp", budget={"max_epochs": 2})
    recorded = {}
    for ranks in (1, 2):
        out = jobs.train(home, ranks, wl, jobs.ENTRIES / "sync", "--seed", "0")
        assert out.returncode in (0, 1), out.stderr[-2000:]
        ledger = Ledger(home / "ledger.sqlite")
        run = [r for r in ledger.runs(level=3) if r["world_size"] == ranks][0]
        recorded[ranks] = [e["metrics"]["train_loss"] for e in ledger.evaluations(run["id"])]
    one, two = np.array(recorded[1]), np.array(recorded[2])
    assert len(one) == len(two) >= 1
    assert np.max(np.abs(two - one) / np.abs(one)) < 1e-4, (one, two)
