"""The zero-3 entry under the judge at `mpiexec -n 2`: it trains, the judge audits it (the first
loss after each hand-over recomputed on the gathered model) and records memory_per_rank from its
own blocks; the attack: ranks that never free nor gather the others' blocks (each training on its
own stale copy of them, and holding the whole model) are recorded failed by the audit, their
memory claim not believed."""

from __future__ import annotations

from pathlib import Path

import pytest

from d500.ledger import Ledger
from tests.distributed import level3_jobs as jobs

pytestmark = [pytest.mark.mpi, pytest.mark.slow,
              pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")]

# An entry's optimizer file that, on import in every rank, keeps stage 3 from freeing the other
# ranks' blocks: the gather before each forward then finds the model "gathered" and skips, so
# each rank trains on its own stale copy of the blocks it does not update.
STALE = '''
from d500.distributed.schemes import zero as _zero
from d500.training.optimizers.sgd import Momentum

_zero.Zero._release = lambda self: None


class Stale(Momentum):
    name = "stale-momentum"
'''


def _last_run(home: Path) -> dict:
    return Ledger(home / "ledger.sqlite").runs(level=3)[-1]


def test_the_zero3_entry_trains_audited_with_its_memory_from_the_judges_blocks(tmp_path):
    home = tmp_path / "home"
    wl = jobs.workload(tmp_path, "digits-mlp", budget={"max_epochs": 2})
    out = jobs.train(home, 2, wl, jobs.ENTRIES / "zero-3", "--seed", "0")
    assert out.returncode in (0, 1), out.stderr[-2000:]
    run = _last_run(home)
    assert run["status"] in ("succeeded", "missed"), run["error"]
    details, figures = run["details"], run["figures"]
    assert details["audited_steps"] >= 1
    whole = 4 * (128 * 64 + 128 + 64 * 128 + 64 + 10 * 64 + 10)
    params = [r["scheme"]["param_bytes"] for r in details["ranks"]]
    assert sum(params) == whole and max(params) < 0.55 * whole, params
    assert all(r["scheme"]["peak_param_bytes"] == whole for r in details["ranks"])
    held = [sum(r["scheme"][k] for k in ("param_bytes", "grad_bytes", "optimizer_bytes"))
            for r in details["ranks"]]
    assert figures["memory_per_rank"] == max(held)


def test_ranks_on_stale_blocks_are_caught_by_the_judge(tmp_path):
    home = tmp_path / "home"
    wl = jobs.workload(tmp_path, "digits-mlp", budget={"max_epochs": 2})
    entry = jobs.entry(tmp_path, "zero-3", folder="stale", files={"stale.py": STALE},
                       name="stale", optimizer="stale.py:Stale")
    out = jobs.train(home, 2, wl, entry, "--seed", "0")
    assert out.returncode != 0
    run = _last_run(home)
    assert run["status"] == "failed", (run["status"], run["error"])
    assert "audit:" in run["error"], run["error"]
