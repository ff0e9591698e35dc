"""Launcher detection for level 3: a plain process (no launcher variables) is one rank and never
imports mpi4py or NumPy through d500.distributed; tune_parallel reuses the same functions."""

from __future__ import annotations

import os
import subprocess
import sys

from d500.distributed import launch
from d500.training import tune_parallel


def plain_process(code: str) -> str:
    """What Python `code` prints in a process no launcher started (exit 0 asserted)."""
    env = {k: v for k, v in os.environ.items() if k not in launch.LAUNCHER_VARIABLES}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_plain_process_imports_neither_mpi_nor_numpy():
    code = ("import sys\nimport d500.distributed\nfrom d500.distributed import launch\n"
            "assert not launch.launched_by_mpi() and launch.world() is None\n"
            "print(sorted(m for m in ('mpi4py', 'numpy', 'torch') if m in sys.modules))")
    assert plain_process(code) == "[]"


def test_tune_parallel_uses_the_same_launcher_detection():
    assert tune_parallel.launched_by_mpi is launch.launched_by_mpi
    assert tune_parallel.world is launch.world
    assert tune_parallel.share_cores is launch.share_cores
    assert tune_parallel.LAUNCHER_VARIABLES is launch.LAUNCHER_VARIABLES
