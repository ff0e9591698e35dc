"""`d500 run`, the main job, end to end on a narrow selection (the full suite is `make run`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from d500.ledger import Ledger

ROOT = Path(__file__).resolve().parent.parent


def d500(*args: str, home: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "D500_HOME": str(home), "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, "-m", "d500.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.mark.slow
def test_run_levels_0_and_1_records_everything_and_prints_the_leaderboard(home):
    result = d500("run", "--workload", "mlp-mnist", "--workload", "gemm-small",
                  "--backends", "reference,onnxruntime", "--quick", "--quiet-wait", "0",
                  home=home)  # the wait for a quiet machine: tests/test_provenance.py
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for title in ("level 0 · gemm-small", "level 1 · check:mlp-mnist", "level 1 · mlp-mnist"):
        assert title in out, out
    html = home / "leaderboard.html"
    assert f"HTML leaderboard: {html}" in out and html.is_file()
    assert "level 1 · mlp-mnist" in html.read_text(encoding="utf-8")
    runs = Ledger(home / "ledger.sqlite").runs()
    seen = {(r["level"], r["workload"], r["backend"], r["status"]) for r in runs}
    assert {(1, "mlp-mnist", "reference", "succeeded"),
            (1, "mlp-mnist", "onnxruntime", "succeeded"),
            (1, "check:mlp-mnist", "onnxruntime", "succeeded")} <= seen
    level0 = [r for r in runs if r["level"] == 0]
    assert {r["submission"] for r in level0} >= {"c-gemm"}
    assert all(r["workload"] == "gemm-small" and r["status"] == "succeeded" for r in level0)
    [summary] = [line for line in out.splitlines() if line.startswith(f"{len(runs)} runs ")]
    assert summary.startswith(f"{len(runs)} runs recorded in {home / 'ledger.sqlite'} (") and \
        "; details: " in summary, out  # one line in a pipe: rich broke it at 160 columns
    assert "level 0" in result.stderr and "net bench" in result.stderr  # the progress bars


@pytest.mark.parametrize("args, message", [
    (["--workload", "no-such-workload"], "no workload named 'no-such-workload' in the selected"),
    (["--workload", "mlp-mnst"], "(did you mean 'mlp-mnist'?)"),  # said before the plan
    (["--level", "3", "--workload", "mlp-mnist"], "level(s) 3 (it is a workload of level 1)"),
    (["--level", "0,1", "--workload", "digits-mlp"], "(it is a workload of levels 2 and 3)"),
    (["--level", "9"], "--level '9': expected one of 0, 1"),
    (["--backends", "nosuch"], "unknown backend 'nosuch'"),
    (["--budget", "0"], "--budget: expected a positive number of seconds"),
    (["--budget", "nan"], "--budget: expected a positive number of seconds"),
    (["--budget", "1e9"], "--budget: expected at most 3,600 seconds (an hour), got '1e9'"),
    (["--workload", "benchmarks"], "--workload benchmarks: a folder, where a workload's name"),
])
def test_bad_selection_is_one_line_and_exit_2(home, args, message):
    result = d500("run", *args, home=home)
    assert result.returncode == 2
    assert message in result.stderr and result.stderr.strip().count("\n") == 0
    assert not (home / "ledger.sqlite").exists()  # nothing ran
