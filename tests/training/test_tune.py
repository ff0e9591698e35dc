"""`d500 tune`: studies of quasi-random trials, each a ledger run; a tuning killed mid-trial
resumes when the same command runs again, losing and repeating no completed trial."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from d500.ledger import Ledger

ROOT = Path(__file__).resolve().parents[2]


def command(home: Path) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "D500_HOME": str(home), "TF_CPP_MIN_LOG_LEVEL": "3"}
    return ([sys.executable, "-m", "d500.cli", "tune", "digits-mlp", "--submission",
             str(ROOT / "submissions" / "adamw"), "--backend", "torch", "--studies", "1",
             "--trials", "3"], env)


def trials(home: Path) -> list[dict]:
    ledger = Ledger(home / "ledger.sqlite")
    [study] = ledger.studies()
    return ledger.trials(study["id"])


@pytest.mark.slow
def test_a_killed_tuning_resumes_with_nothing_lost(tmp_path):
    home = tmp_path / "home"
    argv, env = command(home)
    proc = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    try:  # kill it while its second trial runs, one trial done
        while time.time() < deadline:
            if (home / "ledger.sqlite").exists():
                found = trials(home) if Ledger(home / "ledger.sqlite").studies() else []
                done = [t for t in found if t["run"]["status"] != "running"]
                if len(done) == 1 and len(found) == 2:
                    break
            assert proc.poll() is None, "the tuning ended before it could be killed"
            time.sleep(0.2)
        else:
            pytest.fail("the tuning never reached its second trial")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    before = trials(home)
    assert [t["run"]["status"] for t in before][1] == "interrupted"
    first = before[0]

    result = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    assert "1 trial(s) already done were kept (resumed)" in result.stdout
    after = trials(home)
    by_number: dict[int, list[dict]] = {}
    for t in after:
        by_number.setdefault(t["number"], []).append(t)
    assert sorted(by_number) == [0, 1, 2]
    assert [t["run"]["id"] for t in by_number[0]] == [first["run"]["id"]]  # not rerun
    assert [t["run"]["status"] for t in by_number[1]][0] == "interrupted"  # kept, and
    assert len(by_number[1]) == 2 and by_number[1][1]["attempt"] == 1  # run again
    assert by_number[1][0]["params"] == by_number[1][1]["params"]  # the same trial point
    assert all(t["run"]["status"] != "running" for t in after)
    [study] = Ledger(home / "ledger.sqlite").studies()
    assert study["status"] == "succeeded"
    assert Ledger(home / "ledger.sqlite").verify() == []
