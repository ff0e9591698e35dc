"""How d500 tune decides to run in parallel: an MPI launcher's environment (MPI itself imported
only then), each rank's share of the cores, and the silence limit read from D500_MPI_TIMEOUT.
The parallel runs themselves are in test_tune_mpi.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from d500.errors import D500Error
from d500.training import tune_parallel


@pytest.fixture
def bare(monkeypatch):
    for name in (*tune_parallel.LAUNCHER_VARIABLES, *tune_parallel.LOCAL_SIZE_VARIABLES,
                 "OMP_NUM_THREADS", "D500_MPI_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("name", tune_parallel.LAUNCHER_VARIABLES)
def test_a_launchers_variable_means_mpi(bare, name):
    assert not tune_parallel.launched_by_mpi()
    bare.setenv(name, "0")
    assert tune_parallel.launched_by_mpi()


def test_a_plain_process_never_imports_mpi():
    env = {k: v for k, v in os.environ.items() if k not in tune_parallel.LAUNCHER_VARIABLES}
    code = ("import sys\nfrom d500.training import tune_parallel as t\n"
            "assert t.world() is None and t.running_world() is None\n"
            "print(sorted(m for m in ('mpi4py', 'numpy', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"  # nor NumPy or a framework before share_cores runs


def test_each_local_rank_gets_its_share_of_the_cores_unless_the_user_chose(bare):
    cores = os.cpu_count() or 1
    bare.setenv("MPI_LOCALNRANKS", "2")
    tune_parallel.share_cores()
    assert os.environ["OMP_NUM_THREADS"] == str(max(1, cores // 2))
    bare.setenv("OMP_NUM_THREADS", "7")
    tune_parallel.share_cores()
    assert os.environ["OMP_NUM_THREADS"] == "7"
    bare.delenv("OMP_NUM_THREADS")
    bare.setenv("MPI_LOCALNRANKS", "1")  # one rank here: the framework's own default
    tune_parallel.share_cores()
    assert "OMP_NUM_THREADS" not in os.environ


def test_the_silence_limit(bare):
    assert tune_parallel.limit() == tune_parallel.DEFAULT_LIMIT
    bare.setenv("D500_MPI_TIMEOUT", "2.5")
    assert tune_parallel.limit() == 2.5
    for bad in ("0", "-1", "soon"):
        bare.setenv("D500_MPI_TIMEOUT", bad)
        with pytest.raises(D500Error, match="D500_MPI_TIMEOUT must be a positive number"):
            tune_parallel.limit()
