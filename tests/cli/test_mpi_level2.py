"""`mpiexec -n 2 d500 train` of a level-2 workload (a new user's guess) is refused on every rank
before the backend's framework loads: torch was imported first (10 s under load)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

MPIEXEC = Path(sys.executable).with_name("mpiexec")


@pytest.mark.mpi
@pytest.mark.skipif(not MPIEXEC.exists(), reason="no mpiexec beside Python")
def test_a_level2_workload_under_mpiexec_is_refused_before_torch_loads(tmp_path):
    code = ("import sys; from d500.cli import main; rc = main(sys.argv[1:]); "
            "print('torch' in sys.modules, flush=True); sys.exit(rc)")
    done = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, "-c", code, "train",
                           "digits-mlp", "--submission", "sgd-momentum", "--seed", "3"],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "D500_HOME": str(tmp_path)}, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    # each rank prints whether it imported torch; the two ranks' lines may interleave
    assert done.stdout.count("False") == 2 and "True" not in done.stdout, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2 and all("is a level-2 workload: it trains in one process" in line
                                   for line in lines), done.stderr
