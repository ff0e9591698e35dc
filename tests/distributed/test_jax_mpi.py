"""Level 3 on JAX ranks: `mpiexec -n 2 d500 train digits-mlp --submission sync --backend jax` runs
the sync scheme through the communicator's NumPy path (the JAX trainer's gradients as NumPy
arrays, allreduced, then its jitted apply) and records what the same job records on torch ranks:
the training losses of every evaluation agree to 1e-4."""

from __future__ import annotations

import numpy as np
import pytest

from d500.ledger import Ledger
from tests.distributed import level3_jobs as jobs

pytestmark = [pytest.mark.mpi, pytest.mark.slow,
              pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")]


def test_two_jax_ranks_train_sync_as_two_torch_ranks_do(tmp_path):
    home = tmp_path / "home"
    wl = jobs.workload(tmp_path, "digits-mlp", budget={"max_epochs": 2})
    recorded = {}
    for backend in ("jax", "torch"):
        out = jobs.train(home, 2, wl, jobs.ENTRIES / "sync", "--seed", "0", "--backend", backend,
                         "--threads", "1")
        assert out.returncode in (0, 1), out.stderr[-2000:]
        ledger = Ledger(home / "ledger.sqlite")
        [run] = [r for r in ledger.runs(level=3) if r["backend"] == backend]
        assert run["world_size"] == 2 and run["status"] in ("succeeded", "missed"), run["status"]
        recorded[backend] = [e["metrics"]["train_loss"] for e in ledger.evaluations(run["id"])]
    jax, torch = np.array(recorded["jax"]), np.array(recorded["torch"])
    assert len(jax) == len(torch) >= 1
    assert np.max(np.abs(jax - torch) / np.abs(torch)) < 1e-4, (jax, torch)
