"""`mpiexec -n 2 d500 tune`: the trials shared between two ranks, each recorded once by rank 0
(the worker's through a relay record), the ledger intact, a rerun keeping everything; a crash in
a worker's trial is a failed run; bad input ends every rank with one line and exit 2; a rank
that dies or stops answering does not leave the others waiting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from d500 import mllog
from d500.ledger import Ledger
from tests.helpers import seed_peak
from tests.training.rendezvous import MEET

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = Path(sys.executable).with_name("mpiexec")
ADAMW = ROOT / "submissions" / "adamw"
if not MPIEXEC.exists():
    pytest.skip(f"no mpiexec beside {sys.executable} (pip install mpich mpi4py)",
                allow_module_level=True)

CRASHING_OPTIMIZER = MEET + '''
from d500.training.optimizers import Optimizer


class Exploding(Optimizer):
    """Fails on its third update, the way a buggy submission does."""
    name = "exploding"

    def update(self, ops, params, grads, state, lr, t):
        meet(t)
        if int(t) >= 3:
            raise RuntimeError("submission bug in update()")
        ops.add_(params, grads, -lr)
'''


MEETING_OPTIMIZER = MEET + '''
from d500.training.optimizers.adam import AdamW


class MeetingAdamW(AdamW):
    """AdamW, whose first trial on each rank overlaps the other rank's (rendezvous.py)."""

    def update(self, ops, params, grads, state, lr, t):
        meet(t)
        super().update(ops, params, grads, state, lr, t)
'''


def meeting_adamw(folder: Path) -> Path:
    """The rulebook's adamw entry with MeetingAdamW as its optimizer, in folder/adamw."""
    entry = folder / "adamw"
    entry.mkdir()
    text = (ADAMW / "submission.yaml").read_text()
    (entry / "submission.yaml").write_text(
        text.replace("optimizer: adamw", "optimizer: meeting.py:MeetingAdamW"))
    (entry / "meeting.py").write_text(MEETING_OPTIMIZER)
    return entry


def meeting(folder: Path) -> dict[str, str]:
    """The environment under which each rank's first trial waits for the other's."""
    (folder / "meet").mkdir()
    return {"D500_MEET_DIR": str(folder / "meet")}


def environment(home: Path, **extra: str) -> dict[str, str]:
    seed_peak(home)  # the session's peak FLOP/s, not measured again in every fresh home
    env = {**os.environ, "D500_HOME": str(home), "TF_CPP_MIN_LOG_LEVEL": "3", **extra}
    env.pop("D500_DATA", None)
    return env


def tune_argv(submission: Path, trials: int, *launcher: str, backend: str = "torch"
              ) -> list[str]:
    return [str(MPIEXEC), *launcher, "-n", "2", sys.executable, "-m", "d500.cli", "tune",
            "digits-mlp", "--submission", str(submission), "--backend", backend,
            "--studies", "1", "--trials", str(trials)]


def tune(home: Path, submission: Path = ADAMW, trials: int = 4, timeout: float = 600,
         **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(tune_argv(submission, trials), env=environment(home, **extra),
                          cwd=home.parent, capture_output=True, text=True, timeout=timeout,
                          check=False)


def trials(home: Path) -> list[dict]:
    ledger = Ledger(home / "ledger.sqlite")
    [study] = ledger.studies()
    return ledger.trials(study["id"])


def test_two_ranks_share_the_trials_and_rank_0_records_each_once(tmp_path):
    home, entry = tmp_path / "home", meeting_adamw(tmp_path)
    t0 = time.perf_counter()
    first = tune(home, entry, **meeting(tmp_path))
    took = time.perf_counter() - t0
    assert first.returncode == 0, first.stderr
    found = trials(home)
    assert sorted(t["number"] for t in found) == [0, 1, 2, 3]  # each exactly once
    assert all(t["attempt"] == 0 and t["run"]["status"] == "succeeded" for t in found)
    runs = [t["run"] for t in found]
    assert {r["rank"] for r in runs} == {0, 1}  # both ranks trained
    assert {r["world_size"] for r in runs} == {2}
    assert len({r["group"] for r in runs}) == 1 and runs[0]["group"].startswith("tune ")
    pids = {r["rank"]: r["pid"] for r in runs}
    assert pids[0] != pids[1]  # each run carries the process that trained it
    verify = subprocess.run([sys.executable, "-m", "d500.cli", "ledger", "verify"],
                            env=environment(home), capture_output=True, text=True, timeout=120,
                            check=False)
    assert verify.returncode == 0 and "intact (4 sealed runs" in verify.stdout, verify.stdout
    ledger = Ledger(home / "ledger.sqlite")
    [study] = ledger.studies()
    assert study["status"] == "succeeded"

    worker = next(r for r in runs if r["rank"] == 1)
    assert worker["started_unix"] < worker["stopped_unix"]
    evaluations = ledger.evaluations(worker["id"])
    assert evaluations and all(e["metrics"]["val_accuracy"] > 0 for e in evaluations)
    walls = [e["wall_time"] for e in evaluations]
    assert walls == sorted(walls) and walls[-1] < worker["duration"]
    assert worker["figures"]["time_to_accuracy"] == walls[-1]  # met at its last evaluation
    log = ledger.resolve_path(worker["mllog"])
    events = mllog.parse(log)
    keys = [e["key"] for e in events]
    assert keys[0] == "init_start" and keys[-1] == "run_stop"
    assert keys.index("init_stop") < keys.index("run_start") < keys.index("eval_accuracy")
    assert keys.count("eval_accuracy") == len(evaluations)
    value = {e["key"]: e["value"] for e in events}
    assert value["d500_run_id"] == worker["id"] and value["d500_rank"] == 1
    assert value["d500_world_size"] == 2 and value["seed"] == worker["seed"]
    times = [e["time_ms"] for e in events]
    assert times == sorted(times)
    assert worker["started_unix"] * 1e3 - 1 <= times[keys.index("init_stop")]
    assert times[-1] <= worker["stopped_unix"] * 1e3 + 1  # the worker's own clock, not rank 0's
    assert events[-1]["metadata"]["status"] == "success"
    assert [a["path"] for a in ledger.artifacts(worker["id"])] == [worker["mllog"]]

    lines = first.stdout.splitlines()  # only rank 0 prints the summary
    assert sum(line.startswith("score: ") for line in lines) == 1
    assert sum(line.startswith("study 0 trial ") for line in lines) == 4
    assert any("(rank 1)" in line for line in lines)
    assert "Traceback" not in first.stderr

    t0 = time.perf_counter()
    again = tune(home, entry)
    took_again = time.perf_counter() - t0
    assert again.returncode == 0, again.stderr
    assert "4 trial(s) already done were kept (resumed)" in again.stdout
    assert [t["run"]["id"] for t in trials(home)] == [t["run"]["id"] for t in found]
    assert len(Ledger(home / "ledger.sqlite").runs()) == 4
    print(f"4 trials on 2 ranks: {took:.1f} s; the rerun that keeps them: {took_again:.1f} s")


def test_a_crash_in_a_workers_trial_is_a_failed_run(tmp_path):
    home = tmp_path / "home"
    entry = tmp_path / "exploding"
    entry.mkdir()
    data = yaml.safe_load((ROOT / "submissions" / "sgd-momentum" / "submission.yaml")
                          .read_text())
    data.update(name="exploding", optimizer="exploding.py:Exploding",
                hyperparameters={"lr": 0.1},
                search_space={"lr": {"min": 0.01, "max": 0.1, "scale": "log"}})
    (entry / "submission.yaml").write_text(yaml.safe_dump(data))
    (entry / "exploding.py").write_text(CRASHING_OPTIMIZER)
    result = tune(home, entry, trials=2, **meeting(tmp_path))
    assert result.returncode == 0, result.stderr
    runs = [t["run"] for t in trials(home)]
    assert [r["status"] for r in runs] == ["failed", "failed"]
    assert {r["rank"] for r in runs} == {0, 1}
    assert all("submission bug in update()" in r["error"] for r in runs)
    assert all("Traceback" not in r["error"] for r in runs)
    assert Ledger(home / "ledger.sqlite").verify() == []


@pytest.mark.parametrize("change, backend, message", [
    ({"batch_size": 1024}, "torch",
     "batch_size 1024 is outside the limits of workload 'digits-mlp'"),
    ({}, "nosuch", "unknown backend 'nosuch'"),
    ({}, "onnxruntime", "backend 'onnxruntime' cannot train"),
])
def test_bad_input_is_one_line_and_exit_2_on_every_rank(tmp_path, change, backend, message):
    home = tmp_path / "home"
    entry = tmp_path / "entry"
    entry.mkdir()
    data = yaml.safe_load((ADAMW / "submission.yaml").read_text())
    data.update(change)
    (entry / "submission.yaml").write_text(yaml.safe_dump(data))
    t0 = time.perf_counter()
    result = subprocess.run(tune_argv(entry, 4, backend=backend), env=environment(home),
                            cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()  # one whole line per rank, named by its rank
    assert len(lines) == 2 and all(message in line for line in lines), result.stderr
    assert sorted(line[:9] for line in lines) == ["[rank 0] ", "[rank 1] "], result.stderr
    assert time.perf_counter() - t0 < 120
    assert not (home / "ledger.sqlite").exists() or Ledger(home / "ledger.sqlite").runs() == []


def rank_process(home: Path, rank: int) -> int | None:
    """The pid of the d500 process of `rank` in a job whose D500_HOME is `home`."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (f"D500_HOME={home}".encode() in env and f"PMI_RANK={rank}".encode() in env
                and b"d500.cli" in (entry / "cmdline").read_bytes()):
            return int(entry.name)
    return None


@pytest.fixture
def slow_entry(tmp_path) -> Path:
    """adamw searching learning rates too small to reach the target, at the smallest batch the
    workload allows: every trial misses after the workload's 40 epochs (about 6,000 steps),
    long enough to stop a rank in the middle of one even on an idle machine."""
    entry = tmp_path / "slow"
    entry.mkdir()
    data = yaml.safe_load((ADAMW / "submission.yaml").read_text())
    data.update(name="adamw-slow", batch_size=8,
                search_space={"lr": {"min": 1e-6, "max": 2e-6, "scale": "log"}})
    (entry / "submission.yaml").write_text(yaml.safe_dump(data))
    return entry


def start_and_stop_rank_1(home: Path, entry: Path, sig: signal.Signals, **extra: str
                          ) -> tuple[subprocess.Popen, float]:
    """Start a 2-rank tuning, and send `sig` to rank 1 in the middle of its first trial (2 s
    after rank 0 started its own, when rank 1 has long asked for one)."""
    proc = subprocess.Popen(tune_argv(entry, 4), env=environment(home, **extra),
                            cwd=home.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.time() + 300
    while not ((home / "ledger.sqlite").exists() and Ledger(home / "ledger.sqlite").runs()):
        assert time.time() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    time.sleep(2)
    worker = rank_process(home, 1)
    assert worker is not None and proc.poll() is None
    os.kill(worker, sig)
    return proc, time.perf_counter()


@pytest.mark.serial  # a fault timed from outside: alone, not beside another test
def test_a_killed_rank_ends_the_job_and_the_trials_not_recorded_run_again(tmp_path,
                                                                          slow_entry):
    home = tmp_path / "home"
    proc, killed = start_and_stop_rank_1(home, slow_entry, signal.SIGKILL)
    try:
        proc.communicate(timeout=120)
    finally:
        proc.kill()
    ended = time.perf_counter() - killed
    assert proc.returncode != 0
    before = trials(home)
    assert all(t["run"]["rank"] == 0 for t in before)  # rank 1 recorded nothing yet
    assert len(before) < 4 and before[-1]["run"]["status"] == "interrupted"

    again = tune(home, slow_entry)
    assert again.returncode == 0, again.stderr
    after = trials(home)
    done = sorted(t["number"] for t in after if t["run"]["status"] == "missed")
    assert done == [0, 1, 2, 3]  # every trial once, the killed rank's included
    assert Ledger(home / "ledger.sqlite").verify() == []
    print(f"the job ended {ended:.1f} s after rank 1 was killed")


@pytest.mark.serial  # a fault timed from outside: alone, not beside another test
def test_a_silent_rank_is_given_up_and_the_job_ends(tmp_path, slow_entry):
    home = tmp_path / "home"
    proc, stopped = start_and_stop_rank_1(home, slow_entry, signal.SIGSTOP,
                                          D500_MPI_TIMEOUT="5")
    try:  # a stopped process: MPICH sees nothing wrong, only rank 0's silence limit does
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        worker = rank_process(home, 1)
        if worker is not None:
            os.kill(worker, signal.SIGKILL)
    ended = time.perf_counter() - stopped
    # rank 0 calls MPI_Abort(1); hydra SIGKILLs the stopped rank, and mpiexec reports rank 0's
    # 1 or that rank's 9 as its timing decides (tests/distributed/test_faults_mpi.py)
    assert proc.returncode in (1, 9), err
    assert "rank 1 sent nothing for 5 s while running study 0 trial" in err
    assert "Traceback" not in err
    found = trials(home)
    summary = [(t["number"], t["run"]["rank"], t["run"]["status"]) for t in found]
    assert found and all(status == "missed" for _, _, status in summary), summary
    numbers = [number for number, _, _ in summary]
    assert len(set(numbers)) == len(numbers) < 4, summary  # rank 1's stopped trial: not recorded
    assert Ledger(home / "ledger.sqlite").verify() == []
    print(f"the job ended {ended:.1f} s after rank 1 stopped (silence limit 5 s)")
