"""The communicator on real MPI ranks (`mpiexec -n 2` and `-n 4`, the latter oversubscribing a
2-core machine): the ring allreduce against MPI's Allreduce and its exact byte counts, broadcast,
allgather(v), neighbour exchange (N = 2: both neighbours one rank), torch tensors reduced in place,
buckets into param.grad, counters, the network sweep. The checks are in mpi_comm_checks.py, run
once per world size; each is reported here as its own test."""

from __future__ import annotations

from pathlib import Path

import pytest

from .mpi_jobs import CheckJob

pytestmark = pytest.mark.mpi

JOB = CheckJob(Path(__file__).with_name("mpi_comm_checks.py"))


@pytest.mark.parametrize("name", JOB.names)
@pytest.mark.parametrize("size", [2, 4])
def test_on_mpi_ranks(size, name):
    report = JOB.report(name, size)
    assert report == {"check": name, "size": size, "ok": True}
