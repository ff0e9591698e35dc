"""`d500 tune`: studies of quasi-random trials, each a ledger run; a tuning killed mid-trial
resumes when the same command runs again, losing and repeating no completed trial."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from d500 import children
from d500.ledger import Ledger
from tests.helpers import seed_peak

ROOT = Path(__file__).resolve().parents[2]


HOLDING = '''
"""AdamW that, in a process with D500_HOLD_DIR set, notes each trial it starts training (a file
per trial in that folder: its pid, then each ancestor's pid and command line, three deep) and
holds the second one at its first update until it is killed."""

import json
import os
import time
from pathlib import Path

from d500.training.optimizers.adam import AdamW


class Holding(AdamW):
    name = "holding"

    def update(self, ops, params, grads, state, lr, t):
        folder = os.environ.get("D500_HOLD_DIR")
        if folder and int(t) == 1 and not os.environ.get("HOLDING_WARMED"):
            os.environ["HOLDING_WARMED"] = "1"  # this worker's first update: its warm-up's
            # (a copy stepped on zeros before the clock, d500.training.warmup), not the trial's
        elif folder and int(t) == 1:
            trial = len(list(Path(folder).iterdir())) + 1
            note = Path(folder) / f".{trial}"
            note.write_text(json.dumps(os.getpid()))  # (its namespace's pid: the test finds
            note.replace(Path(folder) / str(trial))  # the host's from outside)
            if trial == 2:
                time.sleep(600)  # killed here, mid-trial, by the test
        super().update(ops, params, grads, state, lr, t)
'''


def holding_entry(folder: Path) -> Path:
    """The rulebook's adamw entry, its optimizer the Holding subclass."""
    entry = folder / "holding"
    entry.mkdir()
    text = (ROOT / "submissions" / "adamw" / "submission.yaml").read_text()
    text = text.replace("name: adamw", "name: adamw-holding").replace(
        "optimizer: adamw", "optimizer: holding.py:Holding")
    (entry / "submission.yaml").write_text(text)
    (entry / "holding.py").write_text(HOLDING)
    return entry


def command(home: Path, entry: Path) -> tuple[list[str], dict[str, str]]:
    seed_peak(home)  # the session's peak FLOP/s, not measured again in a fresh home
    env = {**os.environ, "D500_HOME": str(home), "TF_CPP_MIN_LOG_LEVEL": "3"}
    return ([sys.executable, "-m", "d500.cli", "tune", "digits-mlp", "--submission",
             str(entry), "--backend", "torch", "--studies", "1", "--trials", "3"], env)


def _state(pid: int) -> str:
    """A process's state letter from /proc (Z: a zombie, ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def trials(home: Path) -> list[dict]:
    ledger = Ledger(home / "ledger.sqlite")
    [study] = ledger.studies()
    return ledger.trials(study["id"])


@pytest.mark.slow
def test_a_killed_tuning_resumes_with_nothing_lost(tmp_path):
    """Killed while its second trial trains: that trial holds at its first update (a digits
    trial takes 0.2-0.4 s, too short to catch by polling the ledger, and could end between the
    poll and the kill), so the kill lands mid-trial on any machine."""
    home, held = tmp_path / "home", tmp_path / "held"
    held.mkdir()
    argv, env = command(home, holding_entry(tmp_path))
    log = tmp_path / "tune.err"
    with log.open("w") as err:
        proc = subprocess.Popen(argv, env={**env, "D500_HOLD_DIR": str(held)}, cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 300
    under: list[int] = []
    try:
        while not (held / "2").exists():
            assert proc.poll() is None, f"the tuning ended before its second trial: " \
                                        f"{log.read_text()}"
            assert time.monotonic() < deadline, "the tuning never reached its second trial"
            time.sleep(0.2)
        under = children._descendants(proc.pid)  # the processes below the tuning's (its
    finally:  # forkserver, the worker's keeper, its namespace's pid 1, the worker: d500.children)
        proc.kill()
        proc.wait()
    assert len(under) >= 2, under  # held in the tuning's worker process, not in the tuning's
    for _ in range(50):  # which all end with the tuning process (PR_SET_PDEATHSIG)
        if all(not Path(f"/proc/{pid}").exists() or "Z" in _state(pid) for pid in under):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"processes {under} outlived their killed tuning process")
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


def test_the_score_line_is_one_line_in_a_pipe(tmp_path, capsys):
    """`d500 tune`'s closing score line, printed where stdout is no terminal (a pipe, a log:
    160 columns), stays one line: rich wrapped it at 160 when a tuning had several trial
    statuses, the count of each a dict's repr ({'succeeded': 3, ...})."""
    from d500.cli import stdout_console
    from d500.training import score
    from d500.training.console import print_whole
    from d500.training.tune_cli import score_line
    ledger = Ledger(tmp_path / "ledger.sqlite")
    statuses = ("succeeded", "missed", "diverged", "failed", "interrupted")
    for s in range(2):
        study = ledger.start_study(f"s{s}", 2, "digits-mlp", "adamw", "torch",
                                   "time_to_accuracy")
        for n, status in enumerate(statuses):
            run = ledger.start_run(level=2, workload="digits-mlp", submission="adamw",
                                   backend="torch", study=study.id, trial=n,
                                   hyperparameters={"lr": 0.1 * (n + 1)})
            run.finish(status, figures={"time_to_accuracy": 61.5 + n + s,
                                        "test_accuracy": 0.9} if status == "succeeded" else {})
        study.finish()
    [entry] = score.entries([t["run"] for st in ledger.studies()
                             for t in ledger.trials(st["id"])])
    text = score_line(entry)
    assert len(text) > 160 and text.endswith(
        "over 10 trials; trials: 2 succeeded, 2 missed, 2 diverged, 2 failed, 2 interrupted")
    assert "(median over 2 studies of each study's fastest trial" in text
    print_whole(text, stdout_console())
    assert capsys.readouterr().out == text + "\n"
