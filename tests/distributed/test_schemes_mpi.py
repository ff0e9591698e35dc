"""The schemes on real MPI ranks (`mpiexec -n 2` and `-n 4`, the latter oversubscribing a 2-core
machine): sync and ps equal single-process SGD with the global batch, D-PSGD equals a one-process
simulation of the same gossip (both orders), local SGD with period 1 equals sync, async_ps with
max_staleness 0 equals sequential SGD and otherwise keeps its bound and learns, top-k sends the
compressor's bytes. The checks are in mpi_scheme_checks.py, run once per world size (one job);
each is reported here as its own test."""

from __future__ import annotations

from pathlib import Path

import pytest

from .mpi_jobs import CheckJob

pytestmark = pytest.mark.mpi

JOB = CheckJob(Path(__file__).with_name("mpi_scheme_checks.py"))


@pytest.mark.parametrize("name", JOB.names)
@pytest.mark.parametrize("size", [2, 4])
def test_on_mpi_ranks(size, name):
    JOB.passed(name, size)
