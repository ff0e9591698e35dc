"""The warm-up a worker and a judge make before the clock (d500.training.warmup): zeros shaped
by the model, a step of a copy that leaves the trained model, its optimizer and every RNG state
as they were, and no compile before the clock for a compiling mode."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from d500 import backends
from d500.builders import build, build_lm
from d500.training import submission, warmup

ROOT = Path(__file__).resolve().parents[2]


def test_zeros_follow_the_model_inputs():
    feeds = warmup.zeros(build("mlp", (1, 8, 8), 10, seed=0, loss=True), 5)
    assert {k: (v.shape, v.dtype) for k, v in feeds.items()} == {
        "input": ((5, 1, 8, 8), np.float32), "labels": ((5,), np.int64)}
    lm = warmup.zeros(build_lm("transformer", 64, 1024, seed=0, loss=True, layers=1, width=32,
                               heads=2, tied=True), 3)
    assert {k: v.shape for k, v in lm.items()} == {"input": (3, 64), "labels": (3, 64)}
    assert not any(v.any() for v in lm.values())


@pytest.mark.parametrize("name", ["torch", "jax:eager"])
def test_a_warm_up_leaves_the_run_as_it_was(name):
    """The trained model's next step after a warm-up equals a fresh one's without it, and the
    RNG states are those before it."""
    recipe = submission.load(ROOT / "submissions" / "sgd-momentum").recipe
    job = SimpleNamespace(recipe=recipe)
    model = build("lenet5", (1, 8, 8), 10, seed=0, loss=True)
    backend_cls = backends.get(name)
    rng = np.random.default_rng(1)
    batch = {"input": rng.standard_normal((32, 1, 8, 8), dtype=np.float32),
             "labels": rng.integers(0, 10, 32)}

    def trained() -> tuple[float, float]:
        trainer = backend_cls.prepare(model).trainer(recipe.optimizer(name), loss="loss")
        return trainer.step(batch, 0.05), trainer.step(batch, 0.05)

    plain = trained()
    np.random.seed(7)
    random.seed(7)
    before = (np.random.get_state()[1].copy(), random.getstate())
    trainer = backend_cls.prepare(model).trainer(recipe.optimizer(name), loss="loss")
    warmup.train_step(job, backend_cls, model)
    assert np.array_equal(np.random.get_state()[1], before[0]) and random.getstate() == before[1]
    assert (trainer.step(batch, 0.05), trainer.step(batch, 0.05)) == plain


@pytest.mark.parametrize("name", ["torch:compiled", "tensorflow", "tensorflow:xla", "jax"])
def test_a_mode_that_traces_its_step_traces_nothing_before_the_clock(name, monkeypatch):
    traced = backends.get(name)
    assert traced.traces_step()

    def refuse(*args, **kwargs):
        raise AssertionError(f"{name}'s model was built for a warm-up")

    monkeypatch.setattr(traced, "prepare", refuse)
    recipe = submission.load(ROOT / "submissions" / "sgd-momentum").recipe
    warmup.train_step(SimpleNamespace(recipe=recipe), traced,
                      build("mlp", (1, 8, 8), 10, seed=0, loss=True))


def test_eager_modes_warm_up():
    assert not any(backends.get(n).traces_step() for n in ("torch", "jax:eager", "reference"))


def test_the_warm_ups_bound_is_measured_floored_and_within_the_budget():
    assert warmup.bound(1.0, 128, 86400.0) == (
        320.0, "20x the 1 s the judge took to build its copy and run 8 rows forward, x 128/8 rows")
    assert warmup.bound(0.01, 32, 120.0) == (warmup.FLOOR, "its floor")
    assert warmup.bound(1.0, 128, 90.0) == (90.0, "the workload's whole time budget, "
                                                  "max_seconds")


HANGING = '''
import os
import time

from d500.training.optimizers.adam import AdamW


class Hanging(AdamW):
    """AdamW that hangs at the first update of its process: the worker's warm-up step."""

    def update(self, ops, params, grads, state, lr, t):
        if not os.environ.get("HANGING_DONE"):
            os.environ["HANGING_DONE"] = "1"
            time.sleep(600)
        super().update(ops, params, grads, state, lr, t)
'''


@pytest.mark.slow  # ~6 s quiet, 11 s at load 12: the run's start, then 2 s of hanging
def test_an_optimizer_that_hangs_in_its_warm_up_is_one_line_naming_its_file(tmp_path):
    """It was waited on for the worker's start-up allowance (600 s); now for at most the
    workload's time budget (here 2 s: its warm-up bound, d500.training.warmup.bound), then the
    run fails (exit 1, as any failed run) with one line naming the optimizer's file."""
    import json
    import os
    import subprocess
    import sys
    import time

    from tests.helpers import seed_peak
    entry = tmp_path / "hanging"
    entry.mkdir()
    text = (ROOT / "submissions" / "adamw" / "submission.yaml").read_text()
    (entry / "submission.yaml").write_text(text.replace("name: adamw", "name: adamw-hanging")
                                           .replace("optimizer: adamw",
                                                    "optimizer: hanging.py:Hanging"))
    (entry / "hanging.py").write_text(HANGING)
    workload = tmp_path / "digits-mlp.yaml"
    workload.write_text((ROOT / "levels" / "2-training" / "digits-mlp.yaml").read_text()
                        .replace("max_seconds: 120", "max_seconds: 2"))
    home = tmp_path / "home"
    seed_peak(home)
    env = {**os.environ, "D500_HOME": str(home), "D500_WORKER_START": "spawn"}  # no torch
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "d500.cli", "train", str(workload),
                           "--submission", str(entry), "--backend", "reference", "--seed", "0"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    took = time.monotonic() - began
    line = (f"{entry / 'hanging.py'}: the optimizer Hanging did not finish its warm-up (one "
            f"step of a copy of the model on zeros, before the clock) within 2 s (the "
            f"workload's whole time budget, max_seconds)")
    assert done.returncode == 1 and line in done.stderr.splitlines()[-1], done.stderr
    assert "Traceback" not in done.stderr and took < 120, took  # not START's 600 s
    listed = subprocess.run([sys.executable, "-m", "d500.cli", "ledger", "list", "--json"],
                            env=env, capture_output=True, text=True, timeout=120, check=True)
    [run] = json.loads(listed.stdout)
    assert run["status"] == "failed" and line in run["error"]
