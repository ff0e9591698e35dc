"""The torch-native model-parallel baselines on two real MPI ranks: the checks of
mpi_baseline_checks.py in one `mpiexec -n 2` job, each reported here as its own test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .mpi_jobs import CheckJob

pytestmark = pytest.mark.mpi

JOB = CheckJob(Path(__file__).with_name("mpi_baseline_checks.py"))


@pytest.mark.parametrize("name", JOB.names)
def test_on_two_ranks(name):
    report = JOB.report(name, 2)
    assert report["ok"] is True and report["size"] == 2
    print(f"\n{name}: {json.dumps(report)}")
