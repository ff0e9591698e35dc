"""Batch normalisation under the schemes on real MPI ranks (`mpiexec -n 2` and `-n 3`): running
statistics per rank under sync and the DDP baseline (rank 0's after finish), averaged with the
parameters by local SGD and D-PSGD, broadcast with them by the parameter server; each rank equal
to a one-process simulation. The checks are in mpi_batchnorm_checks.py, run once per world size."""

from __future__ import annotations

from pathlib import Path

import pytest

from .mpi_jobs import CheckJob

pytestmark = pytest.mark.mpi

JOB = CheckJob(Path(__file__).with_name("mpi_batchnorm_checks.py"))


@pytest.mark.parametrize("name", JOB.names)
@pytest.mark.parametrize("size", [2, 3])
def test_on_mpi_ranks(size, name):
    JOB.passed(name, size)
