"""`mpiexec -n 2 d500 train` of a level-3 entry refuses what its files and the command line
already say before any rank loads a framework: a precision level 3 does not train in (bf16: both
ranks imported torch first, 4-9 s under load), torch's own baseline on another backend, a
--seeds count the workload does not have, a --resume RUN rank 0's ledger does not hold."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

MPIEXEC = Path(sys.executable).with_name("mpiexec")
CODE = ("import sys; from d500.cli import main; rc = main(sys.argv[1:]); "
        "print(sorted(m for m in ('torch', 'jax') if m in sys.modules), flush=True); "
        "sys.exit(rc)")


@pytest.mark.mpi
@pytest.mark.skipif(not MPIEXEC.exists(), reason="no mpiexec beside Python")
@pytest.mark.parametrize("args, words", [
    (["--submission", "sync", "--precision", "bf16"], "its lowest_precision is fp32"),
    (["--submission", "ddp-baseline", "--backend", "jax"], "run it with --backend torch"),
    (["--submission", "sync", "--seeds", "9"], "--seeds must be 1 to 3"),
    (["--submission", "sync", "--seed", "5", "--seeds", "1"], "give --seed or --seeds, not both"),
    (["--submission", "sync", "--resume", "99"], "no run 99 in the ledger"),  # rank 0's ledger
])
def test_refused_before_a_framework_loads(tmp_path, args, words):
    done = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, "-c", CODE, "train",
                           "digits-mlp", *args], capture_output=True, text=True, timeout=300,
                          check=False, env={**os.environ, "D500_HOME": str(tmp_path)},
                          cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    # each rank prints the frameworks it imported, none; the two ranks' prints may interleave
    assert done.stdout.count("[]") == 2 and "'" not in done.stdout, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2 and all(words in line for line in lines), done.stderr
