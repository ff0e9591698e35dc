"""Adaptive batch size (d500.training.batch_schedule): a recipe's batch grows by epochs in place of
a decaying learning rate, within the workload's limits; the judge decides each epoch's batch and
the worker trains at it, whatever the entry's code does; samples, MLLOG and d500 check agree."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from d500 import mllog
from d500.errors import ConfigError, UsageError
from d500.ledger import Ledger
from d500.training import batch_schedule, submission, trainer, workloads

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "levels" / "2-training" / "digits-mlp.yaml"
SGD = ROOT / "submissions" / "sgd-momentum"
GROW = {"growth": 2, "every_epochs": 2, "max": 256}
# digits-mlp: 1,197 training samples, drop_last: 37 steps of 32, 18 of 64, 9 of 128, 4 of 256
STEPS = [37, 37, 18, 18, 9, 9, 4, 4]


def _entry(folder: Path, code: str | None = None, **changes) -> submission.Submission:
    """sgd-momentum with a constant lr and the batch schedule GROW (and `changes`)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = yaml.safe_load((SGD / "submission.yaml").read_text())
    data.update({"name": "grow", "schedule": {"name": "constant", "warmup": 0.05},
                 "batch_schedule": GROW, "search_space": {}, "feasible_points": [], **changes})
    if code is not None:
        (folder / "opt.py").write_text(code)
    (folder / "submission.yaml").write_text(yaml.safe_dump(data))
    return submission.load(folder)


def test_the_schedule_gives_each_epochs_batch_and_the_samples_at_each_step():
    grows = batch_schedule.parse(GROW)
    assert batch_schedule.batches(grows, 32, 9) == [32, 32, 64, 64, 128, 128, 256, 256, 256]
    marks = batch_schedule.parse({"growth": 4, "milestones": [1, 3]})
    assert batch_schedule.batches(marks, 8, 5) == [8, 32, 32, 128, 128]
    plan = batch_schedule.Plan.of([32, 64], 1197, True)
    assert plan.steps == (37, 18) and plan.total == 55
    assert plan.samples(37) == 37 * 32 and plan.samples(40) == 37 * 32 + 3 * 64
    assert plan.step_of(37 * 32 + 3 * 64) == 40 and plan.epoch(37) == 1.0
    assert plan.epoch(46) == 1.5
    fixed = batch_schedule.Plan.of([32] * 3, 1197, True)  # a fixed batch: as before
    assert fixed.fixed and fixed.samples(50) == 50 * 32 and fixed.epoch(50) == 50 / 37


@pytest.mark.parametrize("spec, message", [
    ({"growth": 2}, "exactly one of 'every_epochs'"),
    ({"growth": 1, "every_epochs": 2}, "'batch_schedule.growth' must be an integer >= 2"),
    ({"growth": 2, "milestones": [3, 2]}, "'batch_schedule.milestones' must increase"),
    ({"growth": 2, "every_epochs": 2, "rate": 3}, "unknown key 'rate'"),
])
def test_a_malformed_schedule_is_named(spec, message):
    with pytest.raises(ConfigError, match=message):
        batch_schedule.parse(spec)


def test_a_schedule_beyond_the_limits_or_beside_a_decay_is_refused(tmp_path):
    wl = workloads.load(MLP)  # batch 8 to 256, 40 epochs
    recipe = _entry(tmp_path / "e").recipe
    assert recipe.batches(wl)[-1] == 256
    beyond = dataclasses.replace(recipe, batch_schedule={"growth": 2, "every_epochs": 4})
    with pytest.raises(ConfigError, match="grows the batch to 512 at epoch 17, beyond workload "
                                          "'digits-mlp''s batch limit 256"):
        beyond.check(wl)
    with pytest.raises(ConfigError, match="'batch_schedule.max' 512 exceeds"):
        dataclasses.replace(recipe, batch_schedule={**GROW, "max": 512}).check(wl)
    decay = dataclasses.replace(recipe, schedule_spec={"name": "cosine"})
    with pytest.raises(ConfigError, match="'schedule' must be constant .* not 'cosine'"):
        decay.check(wl)
    assert recipe.hyperparameters_logged()["batch_schedule_growth"] == 2


def _d500(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "D500_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "d500.cli", *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env=env)


def test_the_cli_refuses_a_schedule_beyond_the_limit_in_one_line_and_records_nothing(tmp_path):
    folder = tmp_path / "beyond"
    _entry(folder)
    text = (folder / "submission.yaml").read_text()
    (folder / "submission.yaml").write_text(text.replace("max: 256", "max: 1024"))
    result = _d500(tmp_path / "home", "train", "digits-mlp", "--submission", str(folder),
                   "--seed", "3")
    assert result.returncode == 2, result.stderr
    assert "'batch_schedule.max' 1024 exceeds workload 'digits-mlp''s batch limit 256" \
        in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    ledger = tmp_path / "home" / "ledger.sqlite"
    assert not ledger.exists() or Ledger(ledger).runs() == []


def test_level3_refuses_a_growing_batch_before_any_run(tmp_path):
    from d500.distributed import workloads as level3
    recipe = _entry(tmp_path / "e").recipe
    wl = level3.load(ROOT / "levels" / "3-distributed" / "digits-mlp.yaml")
    with pytest.raises(UsageError, match="level 3 trains at a fixed global batch"):
        trainer.preflight(wl, recipe, "torch", None)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """digits-mlp with a growing batch on torch and TensorFlow (seed 0), in one ledger."""
    home = tmp_path_factory.mktemp("grow-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("D500_HOME", str(home))
        entry = _entry(home / "grow")
        ledger, ids = Ledger(), {}
        for backend in ("torch", "tensorflow"):
            result = trainer.train(workloads.load(MLP), entry.recipe, backend, seed=0,
                                   ledger=ledger, submission=entry.name,
                                   submission_files=entry.files)
            assert result.status == "succeeded", result.error
            ids[backend] = result.run_id
        yield home, ledger, ids


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_a_growing_batch_trains_at_the_declared_batches_and_reaches_the_target(runs, backend):
    _, ledger, ids = runs
    run = ledger.get(ids[backend])
    steps = [e["step"] for e in run["evaluations"]]  # digits-mlp evaluates every epoch
    assert np.diff([0, *steps]).tolist() == STEPS[:len(steps)]
    assert run["evaluations"][-1]["metrics"]["val_accuracy"] >= 0.97
    plan = batch_schedule.Plan.of([32, 32, 64, 64, 128, 128, 256, 256], 1197, True)
    figures = run["figures"]
    assert figures["steps"] == steps[-1] and figures["epochs"] == len(steps)
    assert figures["samples_per_second"] == pytest.approx(
        plan.samples(steps[-1]) / figures["train_time"], rel=1e-12)
    path = Path(run["mllog"].replace("$D500_HOME", str(ledger.root)))
    records = mllog.parse(path)
    counts = [r["metadata"][mllog.SAMPLES_COUNT] for r in records
              if r["key"] == mllog.EVAL_ACCURACY]
    assert counts == [plan.samples(s) for s in steps]
    grown = [r["value"] for r in records if r["key"] == trainer.BATCH_KEY]
    assert grown == [32, 32, 64, 64, 128, 128, 256, 256][:len(steps)]
    assert [r["value"] for r in records if r["key"] == mllog.GLOBAL_BATCH_SIZE] == [32]
    from d500.competition import compliance
    assert compliance.problems(path, level=2) == []


@pytest.mark.slow
def test_d500_check_finds_a_growing_batch_consistent_and_a_forged_count_not(runs, tmp_path):
    """The consistency check counts samples at each epoch's batch (step x first batch would
    flag every honest run); a samples_count forged to step x 32 is named."""
    from d500.competition.check import check
    from d500.competition.export import build as pack
    from d500.competition.package import Package
    from d500.paths import rulebook
    from tests.competition.packages import forge_log, repack
    home, ledger, ids = runs
    package = pack(home / "grow", tmp_path / "honest.tar.gz", ledger.path)
    problems = [p for p in check(Package.open(package), rulebook()).problems
                if p.startswith("consistency")]
    assert problems == []
    origin = next(r.origin_id for r in Package.open(package).runs() if r.backend == "torch")

    def log(text: str) -> str:  # the third evaluation (step 92) as if every step were 32
        return text.replace(f'"{mllog.SAMPLES_COUNT}": {37 * 32 * 2 + 18 * 64}',
                            f'"{mllog.SAMPLES_COUNT}": {92 * 32}')

    forged = repack(package, tmp_path / "forged.tar.gz", forge_log(origin, log))
    problems = [p for p in check(Package.open(forged), rulebook()).problems
                if p.startswith("consistency")]
    assert any("evaluation 3 (epoch 3.0): step 92 at each epoch's batch" in p
               for p in problems), problems


# Tries to train at a batch of its own choosing: it finds, through the stack (every update) and
# the heap (at each epoch's first), the job's recipe and the worker's samplers, and sets the
# batch to 8 and the schedule away; it records the batch it actually trains at (the rows of the
# step's feeds, in the worker's frame) in $D500_BATCHES.
ATTACK = '''
import gc, inspect, os
from d500.training.optimizers import Optimizer


class Shrink(Optimizer):
    name = "shrink"

    def update(self, ops, params, grads, state, lr, t):
        seen, changed = None, 0
        for frame in inspect.stack():
            f = frame.frame.f_locals
            if "feeds" in f and "ahead" in f:  # the worker's loop (d500.training.worker.main)
                seen = len(f["feeds"]["labels"])
            job = f.get("job")
            if job is not None and hasattr(job, "recipe"):
                job.recipe.batch_size, job.recipe.batch_schedule = 8, None
                changed += 1
        for obj in gc.get_objects() if int(t) in (1, 38, 56) else ():  # each epoch's start
            if type(obj).__name__ in ("EpochSampler", "Recipe"):
                object.__setattr__(obj, "batch_size", 8)
                changed += 1
        with open(os.environ["D500_BATCHES"], "a") as out:
            out.write(f"{seen} {changed}\\n")
        ops.add_(params, grads, -lr)
'''


def test_an_entry_cannot_change_the_batch_it_trains_at(tmp_path, monkeypatch):
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    seen = tmp_path / "batches.txt"
    monkeypatch.setenv("D500_BATCHES", str(seen))
    entry = _entry(tmp_path / "attack", code=ATTACK, optimizer="opt.py:Shrink",
                   hyperparameters={"lr": 0.1}, batch_schedule={"growth": 2, "every_epochs": 1})
    wl = workloads.load(MLP)
    wl.max_epochs, wl.target = 3, 1.0  # 32, 64, 128: 37 + 18 + 9 steps
    ledger = Ledger()
    result = trainer.train(wl, entry.recipe, "torch", 0, ledger=ledger, submission="attack")
    assert result.status == "missed", result.error
    # (the warm-up's step on zeros, before the clock, is in no worker frame with a batch)
    looks = [line.split() for line in seen.read_text().splitlines()]
    trained = [int(batch) for batch, _ in looks if batch != "None"]
    assert all(int(changed) >= 1 for _, changed in looks)  # it did reach the objects
    assert max(int(changed) for _, changed in looks) >= 3
    assert trained == [32] * 37 + [64] * 18 + [128] * 9
    steps = [e["step"] for e in ledger.get(result.run_id)["evaluations"]]
    assert steps == [37, 55, 64]
    assert json.loads(json.dumps(ledger.get(result.run_id)["hyperparameters"]))[
        "batch_schedule_every_epochs"] == 1
