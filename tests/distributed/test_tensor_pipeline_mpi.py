"""Tensor parallelism inside pipeline stages on real `mpiexec -n 4` ranks ({pipeline: 2,
tensor: 2}): the checks of mpi_tensor_pipeline_checks.py (a 2-layer transformer, one layer a
stage, each split over 2 tensor ranks, gives one process's losses and parameters within 1e-5
relative, and each rank reports less memory than at {data: 2, pipeline: 2} or {data: 2,
tensor: 2}; a checkpoint of it continues bit for bit). 4 ranks on a 2-core machine: one job,
about 50 s."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed import level3_jobs as jobs
from tests.distributed.mpi_jobs import CheckJob

pytestmark = [pytest.mark.mpi, pytest.mark.slow,
              pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")]

JOB = CheckJob(Path(__file__).with_name("mpi_tensor_pipeline_checks.py"))


def test_tensor_inside_pipeline_stages_at_four_ranks():
    name = "tensor_inside_pipeline_equals_one_process_and_holds_less"
    report = JOB.passed(name, 4)
    assert report["memory_per_rank"] < report["pipeline_only_memory_per_rank"]
    assert report["memory_per_rank"] < report["tensor_only_memory_per_rank"]


def test_a_checkpoint_of_tensor_inside_pipeline_continues_bit_for_bit():
    """The same job: its checkpoint (d500.distributed.resuming) restored into ranks built from
    another seed continues as the saved ranks, and matches the judge's digest."""
    report = JOB.report("tensor_inside_pipeline_checkpoint_continues_bit_for_bit", 4)
    assert report["ok"] is True and report["digest_matches"] is True
