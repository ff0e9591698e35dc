"""`d500 train` end to end on the real digits data: statuses (succeeded, missed, diverged,
failed), figures, evaluations, the MLLOG under MLPerf Training 6.1.0's own checker, and bad
input refused with one line and nothing recorded."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from d500 import mllog
from d500.ledger import Ledger
from d500.training import submission, workloads
from d500.training.trainer import train

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "levels" / "2-training" / "digits-mlp.yaml"
SGD = ROOT / "submissions" / "sgd-momentum"

FAILING_OPTIMIZER = '''
from d500.training.optimizers import Optimizer


class Exploding(Optimizer):
    """Fails on its third update, the way a buggy submission does."""
    name = "exploding"

    def update(self, ops, params, grads, state, lr, t):
        if int(t) >= 3:
            raise RuntimeError("submission bug in update()")
        ops.add_(params, grads, -lr)
'''


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    return tmp_path / "home"


def _entry(tmp_path: Path, **changes) -> Path:
    data = yaml.safe_load((SGD / "submission.yaml").read_text())
    data.update(changes)
    folder = tmp_path / "entry"
    folder.mkdir(exist_ok=True)
    (folder / "submission.yaml").write_text(yaml.safe_dump(data))
    return folder


def _log_path(ledger: Ledger, run_id: int) -> Path:
    return Path(ledger.get(run_id)["mllog"].replace("$D500_HOME", str(ledger.root)))


def test_a_run_reaches_the_target_and_records_every_evaluation(home, monkeypatch):
    """Its time split is of the time up to the last evaluation: the worker's finish, after the
    evaluation that met the target, made to take a known while (level 3's schemes gather the
    model there), is in none of its parts (once it was, and d500 check flagged the run)."""
    from d500.training.worker import Worker
    real, slow = Worker.finish, 0.5

    def finish(self, want):
        time.sleep(slow)
        return real(self, want)

    monkeypatch.setattr(Worker, "finish", finish)
    wl = workloads.load(MLP)
    entry = submission.load(SGD)
    ledger = Ledger()
    result = train(wl, entry.recipe, "torch", seed=0, ledger=ledger, submission=entry.name,
                   submission_files=entry.files)
    assert result.status == "succeeded", result.error
    run = ledger.get(result.run_id)
    f = run["figures"]
    assert 0 < f["time_to_accuracy"] < wl.max_seconds
    assert f["val_accuracy"] >= wl.target and 0.85 < f["test_accuracy"] <= 1
    assert f["data_time"] > 0 and f["eval_time"] > 0 and f["train_time"] > 0
    evals = ledger.evaluations(result.run_id)
    # d500 check's bound (consistency_training.Training.split), exactly
    assert f["train_time"] + f["eval_time"] + f["data_time"] <= evals[-1]["wall_time"]
    samples = f["steps"] * entry.recipe.batch_size
    assert f["samples_per_second"] == pytest.approx(samples / f["train_time"], rel=1e-9)
    assert len(evals) == f["epochs"]  # one per epoch, the last one met the target
    assert [e["epoch"] for e in evals] == list(range(1, len(evals) + 1))
    assert all({"val_accuracy", "test_accuracy", "train_loss"} <= set(e["metrics"])
               for e in evals)
    assert evals[-1]["metrics"]["val_accuracy"] >= wl.target
    assert all(e["metrics"]["val_accuracy"] < wl.target for e in evals[:-1])
    assert evals[-1]["wall_time"] == pytest.approx(f["time_to_accuracy"])
    assert run["hyperparameters"]["optimizer"] == "momentum" and run["seed"] == 0
    assert ledger.verify() == []


def _check(path: Path) -> list[str]:
    """MLPerf Training 6.1.0's own parser and compliance checker on a level-2 log, with only
    the rules that cannot apply to d500 left out (d500.competition.compliance says which)."""
    from d500.competition import compliance
    return compliance.problems(path, level=2)


def test_the_mllog_passes_mlperf_training_6_1_0_checks(home, tmp_path):
    wl = workloads.load(MLP)
    entry = submission.load(SGD)
    ledger = Ledger()
    result = train(wl, entry.recipe, "torch", seed=1, ledger=ledger, submission=entry.name)
    assert result.status == "succeeded", result.error
    path = _log_path(ledger, result.run_id)
    assert _check(path) == []
    records = mllog.parse(path)
    keys = [r["key"] for r in records]
    assert keys.index("init_stop") < keys.index("run_start") < keys.index("train_samples")
    assert keys[-1] == "run_stop" and records[-1]["metadata"]["status"] == "success"
    accuracies = [r for r in records if r["key"] == "eval_accuracy"]
    assert accuracies[-1]["value"] >= wl.target and "epoch_num" in accuracies[-1]["metadata"]
    # the same checker rejects the log with a required key removed
    cut = tmp_path / "cut.txt"
    cut.write_text("".join(line + "\n" for line in path.read_text().splitlines()
                           if '"micro_batch_size"' not in line))
    assert any("micro_batch_size" in m for m in _check(cut))


def test_missed_and_diverged_runs_score_infinity_and_stay_in_the_ledger(home, tmp_path):
    wl = workloads.load(MLP)
    wl.max_epochs = 1
    slow = submission.load(_entry(tmp_path, hyperparameters={"lr": 0.0001}))
    ledger = Ledger()
    missed = train(wl, slow.recipe, "torch", seed=0, ledger=ledger, submission="slow")
    assert missed.status == "missed" and "did not reach the target" in missed.error
    assert ledger.get(missed.run_id)["figures"]["time_to_accuracy"] == math.inf
    wl = workloads.load(MLP)
    wild = submission.load(_entry(tmp_path, hyperparameters={"lr": 1e6},
                                  schedule={"name": "constant"}))
    diverged = train(wl, wild.recipe, "torch", seed=0, ledger=ledger, submission="wild")
    assert diverged.status == "diverged" and "training loss is" in diverged.error
    statuses = {r["submission"]: r["status"] for r in ledger.runs(level=2)}
    assert statuses == {"slow": "missed", "wild": "diverged"}


def test_a_crash_in_the_submissions_optimizer_is_a_failed_run_not_a_traceback(home, tmp_path):
    folder = _entry(tmp_path, optimizer="exploding.py:Exploding", hyperparameters={"lr": 0.1},
                    search_space={"lr": {"min": 0.01, "max": 0.1, "scale": "log"}})
    (folder / "exploding.py").write_text(FAILING_OPTIMIZER)
    entry = submission.load(folder)
    result = train(workloads.load(MLP), entry.recipe, "torch", seed=0, submission="exploding",
                   submission_files=entry.files)
    assert result.status == "failed" and "submission bug in update()" in result.error
    run = Ledger().get(result.run_id)
    assert run["status"] == "failed" and "Traceback" not in run["error"]
    assert any(str(p).endswith("exploding.py") for p in run["submission_files"])


def d500(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "D500_HOME": str(home), "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("D500_DATA", None)
    return subprocess.run([sys.executable, "-m", "d500.cli", *args], capture_output=True,
                          text=True, timeout=600, cwd=ROOT, env=env)


@pytest.mark.parametrize("change, message", [
    ({"batch_size": 1024}, "batch_size 1024 is outside the limits of workload 'digits-mlp'"),
    ({"optimizer": "rmsprop"}, "field 'optimizer' is 'rmsprop'"),
    ({"search_space": {"lr": {"min": 1.0, "max": 0.1}}}, "needs numbers min < max"),
    ({"workloads": ["digits-lenet"]}, "does not enter workload 'digits-mlp'"),
])
def test_an_entry_outside_the_rules_is_one_line_exit_2_and_nothing_recorded(
        home, tmp_path, change, message):
    result = d500(home, "train", "digits-mlp", "--submission", str(_entry(tmp_path, **change)))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (home / "ledger.sqlite").exists() or Ledger(home / "ledger.sqlite").runs() == []


def test_a_missing_dataset_says_how_to_get_it(home, tmp_path):
    wl = tmp_path / "mnist-mlp.yaml"
    wl.write_text(MLP.read_text().replace("name: digits-mlp", "name: mnist-mlp").replace(
        "{name: digits, train: 1197, validation: 300, test: 300",
        "{name: mnist, train: 55000, validation: 5000, test: 10000"))
    folder = _entry(tmp_path, workloads=["mnist-mlp"])
    result = d500(home, "train", str(wl), "--submission", str(folder), "--data", str(tmp_path))
    assert result.returncode == 2
    assert "train-images-idx3-ubyte.gz: missing" in result.stderr
    assert "d500 data download mnist" in result.stderr
    assert not (home / "ledger.sqlite").exists() or Ledger(home / "ledger.sqlite").runs() == []
