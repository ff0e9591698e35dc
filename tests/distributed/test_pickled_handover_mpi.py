"""Rank 0 runs the entry's code beside the level-3 judge's pipe: an optimizer that sends the
judge (d500.distributed.judge) a pickle whose loading calls exec, on a real `mpiexec -n 2` job,
runs nothing in the judge's process (d500.untrusted); the job fails with a line naming the
object. (Level 2's and level 0's twins: tests/training/test_pickled_handover.py.)"""

from __future__ import annotations

import pytest

from tests.distributed import level3_jobs as jobs
from tests.training.test_pickled_handover import EXEC

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")]


def test_rank_0_sending_the_judge_a_pickle_that_calls_exec_runs_nothing_there(tmp_path):
    pwned = tmp_path / "pwned"
    out = jobs.attacked(tmp_path, EXEC, "Plain", D500_PWNED=str(pwned))
    assert not pwned.exists(), f"code ran in process {pwned.read_text()}"
    assert out.returncode != 0
    assert "(builtins.exec)" in out.stderr, out.stderr
