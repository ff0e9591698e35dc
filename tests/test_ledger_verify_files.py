"""`d500 ledger verify` tells a changed file apart from a tampered ledger (issue 22, item 10): a
workload, model or submission file that differs from what runs recorded is one line per file
naming its runs (for d500's own rulebook, which a newer d500 edits, where the recorded text is),
the rows are verified on their own, and exit 1 is kept for tampering (a row, a figure, an
artifact under $D500_HOME). Real ledgers written through d500.ledger."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from d500.ledger import Ledger
from d500.paths import rulebook

ROOT = Path(__file__).resolve().parents[1]
GEMM = rulebook() / "0-operators" / "gemm-256.yaml"


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def verify(home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "D500_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "d500.cli", "ledger", "verify"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
                          check=False)


def older_rulebook_runs(home: Path, count: int, code: Path) -> None:
    """`count` level-0 runs as an older d500 recorded them: under the rulebook's gemm-256.yaml as
    it read then (another text, so another sha256, sealed with the row) and a submission file."""
    old_text = GEMM.read_text() + "# as an older d500 shipped it\n"
    old_sha = hashlib.sha256(old_text.encode()).hexdigest()
    ledger = Ledger()
    for seed in range(count):
        run = ledger.start_run(level=0, workload="gemm-256", submission="mine",
                               backend="numpy", seed=seed, workload_file=GEMM,
                               submission_files=[code])
        db = sqlite3.connect(home / "ledger.sqlite")  # before its seal: what it ran under then
        db.execute("UPDATE runs SET workload_sha256 = ?, workload_text = ? WHERE id = ?",
                   (old_sha, old_text, run.id))
        db.commit()
        db.close()
        run.finish("succeeded", figures={"latency": 1e-3})


def test_an_evolved_rulebook_is_one_finding_per_file_and_exit_0(home, tmp_path):
    code = tmp_path / "op.py"
    code.write_text("SCALE = 1\n")
    older_rulebook_runs(home, 4, code)
    code.write_text("SCALE = 2\n")  # the user's own file, edited after its runs
    done = verify(home)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3, lines  # one per file, then the summary: never one per run
    [gemm] = [line for line in lines if str(GEMM) in line]
    assert gemm.startswith(f"workload file {GEMM} differs from what runs 1..4 recorded (sha256 ")
    assert "d500's own rulebook moved on since (not a change to the ledger); the text each run " \
           "ran under is kept in the ledger: `d500 ledger show 1 --json` (workload_text)" in gemm
    [mine] = [line for line in lines if str(code) in line]
    assert mine.startswith(f"submission file {code} differs from what runs 1..4 recorded")
    assert mine.endswith(": the runs no longer match this file (edited or replaced after they "
                         "ran)")
    assert lines[-1].startswith("ledger ") and "intact (4 sealed runs, 0 not finished); 2 " \
        "file(s) changed or missing since runs recorded them (above): findings about those " \
        "files, not the ledger's rows" in lines[-1]
    assert "Traceback" not in done.stderr


def test_a_tampered_row_is_still_exit_1_beside_the_file_findings(home, tmp_path):
    code = tmp_path / "op.py"
    code.write_text("SCALE = 1\n")
    older_rulebook_runs(home, 3, code)
    db = sqlite3.connect(home / "ledger.sqlite")
    db.execute("""UPDATE runs SET figures = '{"latency": 1e-06}' WHERE id = 2""")
    db.commit()
    db.close()
    done = verify(home)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "run 2: figures changed in the database since the run was recorded"
    assert len(lines) == 2 and lines[1].startswith(f"workload file {GEMM} differs from what "
                                                   f"runs 1..3 recorded"), lines
    assert "1 problem(s) in 1 run(s); 1 file(s) changed or missing" in done.stderr
    # an artifact under $D500_HOME (a run's MLLOG) edited: tampering, named by run
    mllog = home / "runs" / "3" / "mllog.txt"
    mllog.write_text(mllog.read_text() + "forged\n")
    again = verify(home)
    assert again.returncode == 1 and f"run 3: artifact {mllog} changed since it was " \
        "recorded" in again.stdout, again.stdout
