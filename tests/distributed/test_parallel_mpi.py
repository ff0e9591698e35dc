"""Level 3's dimensions, weighted shares, the stale-synchronous parameter server and ZeRO stages 1
and 2 on two real MPI ranks: the checks of mpi_parallel_checks.py, run in one `mpiexec -n 2` job,
each reported here as its own test."""

from __future__ import annotations

from pathlib import Path

import pytest

from .mpi_jobs import CheckJob

pytestmark = pytest.mark.mpi

JOB = CheckJob(Path(__file__).with_name("mpi_parallel_checks.py"))


@pytest.mark.parametrize("name", JOB.names)
def test_on_two_ranks(name):
    JOB.passed(name, 2)
