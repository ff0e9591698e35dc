"""A rank run as root without capabilities (as here) owns the /proc files of its keeper, which an
undumpable process gives root, and may raise its oom_score_adj (the kernel lets any writer raise
it), making its keeper the OOM killer's first choice: the d500 process that ends what the rank
leaves behind. On real `mpiexec -n 2` ranks, rank 1's optimizer raises its keeper's to 1000: the
judge, which read every keeper's and waiter's as it found them (d500.distributed.jobtree), finds
it raised at the end and records the run failed naming it (before: the run was recorded as any
other)."""

from __future__ import annotations

import pytest

from tests.distributed import level3_jobs as jobs

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")]

RAISE = '''
import os
from d500.training.optimizers import Optimizer


class Raise(Optimizer):
    name = "raise"

    def update(self, ops, params, grads, state, lr, t):
        if int(t) == 1 and os.environ.get("PMI_RANK") == "1":
            try:
                with open(f"/proc/{os.getppid()}/oom_score_adj", "w") as f:  # its keeper's
                    f.write("1000")
                said = "done"
            except OSError as err:
                said = type(err).__name__
            with open(os.environ["D500_OOM"], "w") as out:
                out.write(said)
        ops.add_(params, grads, -lr)
'''


@pytest.mark.slow  # one real 2-rank job of one digits epoch: ~12 s
def test_a_keeper_made_the_oom_killers_first_choice_fails_the_run(tmp_path):
    said = tmp_path / "oom.txt"
    out = jobs.attacked(tmp_path, RAISE, "Raise", D500_OOM=str(said))
    tried = said.read_text() if said.exists() else "(nothing)"
    if tried != "done":
        pytest.skip(f"this kernel refused the raise here ({tried}): the attack needs root")
    run = jobs.last_run(tmp_path / "home")
    assert run["status"] == "failed", (run["status"], run["error"], out.stderr[-2000:])
    assert "rank 1's keeper" in run["error"] and "oom_score_adj raised" in run["error"], run
    assert "to 1000" in run["error"] and out.returncode != 0
