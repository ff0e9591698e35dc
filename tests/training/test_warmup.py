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
