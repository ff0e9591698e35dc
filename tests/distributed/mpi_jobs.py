"""A script of named checks run once per world size under the venv's `mpiexec`, each check's
JSON report handed to its own test (shared by the communicator and scheme MPI tests)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MPIEXEC = Path(sys.executable).with_name("mpiexec")
# seconds one job (every check at one size) may take before it is taken as hung: the batchnorm
# job at 3 ranks takes 24 s on an idle 2-core machine and 43 s with its ranks sharing one core
# with two busy processes
JOB_LIMIT = 600


class CheckJob:
    """The checks of `script` (its CHECKS), run at most once per world size."""

    def __init__(self, script: Path):
        if not MPIEXEC.exists():
            pytest.skip(f"no mpiexec beside {sys.executable} (pip install mpich mpi4py)",
                        allow_module_level=True)
        spec = importlib.util.spec_from_file_location(script.stem, script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        self.script = script
        self.names = list(module.CHECKS)  # the names; the checks run under mpiexec
        self._runs: dict[int, tuple[dict[str, dict], str]] = {}

    def run(self, size: int) -> tuple[dict[str, dict], str]:
        """Every check at `size` ranks, once: {check: its JSON report}, and the job's stderr."""
        if size not in self._runs:
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            try:
                out = subprocess.run([str(MPIEXEC), "-n", str(size), sys.executable,
                                      str(self.script)], env=env, capture_output=True,
                                     text=True, timeout=JOB_LIMIT, check=False)
                stdout, stderr = out.stdout, out.stderr
            except subprocess.TimeoutExpired as err:
                stdout, stderr = str(err.stdout or ""), f"mpiexec timed out: {err.stderr}"
            reports: dict[str, dict] = {}
            decoder, text, i = json.JSONDecoder(), stdout, 0
            while (i := text.find("{", i)) >= 0:  # ranks that abort may print on one line
                report, i = decoder.raw_decode(text, i)
                if "error" in report or report["check"] not in reports:
                    reports[report["check"]] = report
            self._runs[size] = reports, stderr[-3000:]
        return self._runs[size]

    def report(self, name: str, size: int) -> dict:
        """Check `name`'s report at `size` ranks; a check that did not run or raised fails."""
        reports, stderr = self.run(size)
        report = reports.get(name)
        if report is None:
            failed = [r for r in reports.values() if "error" in r]
            why = f"{failed[0]['check']} failed before it" if failed else f"no report: {stderr}"
            pytest.fail(f"{name} at {size} ranks did not run: {why}")
        assert "error" not in report, f"rank {report.get('rank')}:\n{report.get('error')}"
        return report

    def passed(self, name: str, size: int) -> dict:
        """Check `name`'s report at `size` ranks, which must say ok at that size (printed)."""
        report = self.report(name, size)
        assert report["ok"] is True and report["size"] == size, report
        print(f"\n{name} at {size} ranks: {json.dumps(report)}")
        return report
