"""Start `mpiexec -n N d500 train ...` from Python (`d500 run`'s level-3 stage, tests): the MPICH
launcher installed beside this interpreter (the venv's `mpich` wheel), the same environment
(`$D500_HOME` included, so the child ranks' rank 0 records into the same ledger), and the
result read from rank 0's `--json` output.

    report = launch_train("levels/3-distributed/digits-mlp.yaml", "submissions/sync", 2)
    report.runs      # [{"run_id", "status", "figures", ...}] from rank 0
    report.summary   # one line; report.problem: why it failed, or ""

mpiexec runs with `-disable-auto-cleanup`: a rank that dies does not take rank 0 down at once,
so rank 0's watchdog can record the run failed naming it (d500.distributed.faults).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


@dataclasses.dataclass
class LaunchReport:
    """What one mpiexec of `d500 train` gave: rank 0's runs, its exit code, one-line summary."""

    returncode: int
    runs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    stderr: str = ""
    problem: str = ""

    @property
    def summary(self) -> str:
        if not self.runs:
            return self.problem or f"mpiexec exited {self.returncode}"
        return ", ".join(f"run {r['run_id']} {r['status']}" for r in self.runs)


def mpiexec() -> Path | None:
    """The MPICH launcher beside this Python (the venv's), or None."""
    found = Path(sys.executable).with_name("mpiexec")
    return found if found.exists() else None


def train_argv(workload: str | Path, submission: str | Path, ranks: int, *,
               backend: str = "torch", extra: Sequence[str] = (),
               launcher_options: Sequence[str] = ("-disable-auto-cleanup",)) -> list[str]:
    """The command line: mpiexec [options] -n N python -m d500.cli train ... --json."""
    launcher = mpiexec()
    if launcher is None:
        raise FileNotFoundError(f"no mpiexec beside {sys.executable} (pip install mpich mpi4py)")
    return [str(launcher), *launcher_options, "-n", str(ranks), sys.executable, "-m",
            "d500.cli", "train", str(workload), "--submission", str(submission), "--backend",
            backend, "--json", *extra]


def launch_train(workload: str | Path, submission: str | Path, ranks: int, *,
                 backend: str = "torch", extra: Sequence[str] = (), timeout: float = 600.0,
                 env: dict[str, str] | None = None,
                 log: Callable[[str], None] = lambda text: None) -> LaunchReport:
    """Run the job to its end (or kill it after `timeout` seconds); never raises for a failed
    job: the report says what happened."""
    try:
        argv = train_argv(workload, submission, ranks, backend=backend, extra=extra)
    except FileNotFoundError as err:
        return LaunchReport(-1, problem=str(err))
    log("$ " + " ".join(argv))
    proc = subprocess.Popen(argv, env=env if env is not None else dict(os.environ),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        log(err)
        return LaunchReport(-1, stderr=err, problem=f"mpiexec -n {ranks} did not finish "
                                                     f"within {timeout:g} s; killed")
    log(out)
    log(err)
    report = LaunchReport(proc.returncode, _runs(out), err)
    if not report.runs or proc.returncode not in (0, 1):
        lines = [line for line in err.splitlines() if "error" in line.lower()]
        report.problem = lines[0] if lines else f"mpiexec exited {proc.returncode}"
    elif any(r["status"] != "succeeded" for r in report.runs):
        bad = next(r for r in report.runs if r["status"] != "succeeded")
        report.problem = f"run {bad['run_id']} {bad['status']}: {bad['error']}"
    return report


def _runs(stdout: str) -> list[dict[str, Any]]:
    """The JSON list rank 0 printed (the other ranks print nothing on stdout)."""
    start = stdout.find("[")
    if start < 0:
        return []
    try:
        found, _ = json.JSONDecoder().raw_decode(stdout[start:])
    except json.JSONDecodeError:
        return []
    return found if isinstance(found, list) else []
