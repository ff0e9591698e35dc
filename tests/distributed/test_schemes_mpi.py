"""The schemes on real MPI ranks (`mpiexec -n 2` and `-n 4`, the latter oversubscribing a 2-core
machine): sync and ps equal single-process SGD with the global batch, D-PSGD equals a one-process
simulation of the same gossip (both orders), local SGD with period 1 equals sync, async_ps with
max_staleness 0 equals sequential SGD and otherwise keeps its bound and learns, top-k sends the
compressor's bytes. The checks are in mpi_scheme_checks.py, run once per world size (one job);
each is reported here as its own test."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.mpi

SCRIPT = Path(__file__).with_name("mpi_scheme_checks.py")
_spec = importlib.util.spec_from_file_location("mpi_scheme_checks", SCRIPT)
_checks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_checks)
CHECKS = list(_checks.CHECKS)  # the names; the checks run under mpiexec
MPIEXEC = Path(sys.executable).with_name("mpiexec")
if not MPIEXEC.exists():
    pytest.skip(f"no mpiexec beside {sys.executable} (pip install mpich mpi4py)",
                allow_module_level=True)
_runs: dict[int, tuple[dict[str, dict], str]] = {}


def run_checks(size: int) -> tuple[dict[str, dict], str]:
    """Every check at `size` ranks, once: {check: its JSON report}, and the job's stderr."""
    if size not in _runs:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        try:
            out = subprocess.run([str(MPIEXEC), "-n", str(size), sys.executable, str(SCRIPT)],
                                 env=env, capture_output=True, text=True, timeout=150,
                                 check=False)
            stdout, stderr = out.stdout, out.stderr
        except subprocess.TimeoutExpired as err:
            stdout, stderr = str(err.stdout or ""), f"mpiexec timed out: {err.stderr}"
        reports: dict[str, dict] = {}
        decoder, text, i = json.JSONDecoder(), stdout, 0
        while (i := text.find("{", i)) >= 0:  # ranks that abort may print on one line
            report, i = decoder.raw_decode(text, i)
            if "error" in report or report["check"] not in reports:
                reports[report["check"]] = report
        _runs[size] = reports, stderr[-3000:]
    return _runs[size]


@pytest.mark.parametrize("name", CHECKS)
@pytest.mark.parametrize("size", [2, 4])
def test_on_mpi_ranks(size, name):
    reports, stderr = run_checks(size)
    report = reports.get(name)
    if report is None:
        failed = [r for r in reports.values() if "error" in r]
        why = f"{failed[0]['check']} failed before it" if failed else f"no report: {stderr}"
        pytest.fail(f"{name} at {size} ranks did not run: {why}")
    assert "error" not in report, f"rank {report.get('rank')}:\n{report.get('error')}"
    assert report["ok"] is True and report["size"] == size
    print(f"\n{name} at {size} ranks: {json.dumps(report)}")
