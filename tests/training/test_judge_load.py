"""Judge.load (d500.training.trainer) writes a hand-over one of two ways: into NumPy views of the
judge's parameters where the backend has them (torch), else through set_parameters; running
statistics through set_buffers on both. Both are given the same arrays (checked and cast to the
judge's dtypes first), and these tests hold them equal: on every trainable backend a hand-over
of a batch-norm model, sent as float64, ends as the worker's values bit for bit and predicts what
the worker's model predicts; on torch the views and set_parameters give the same judge."""

from __future__ import annotations

import numpy as np
import pytest

from d500 import backends
from d500.errors import D500Error
from d500.training import trainer
from d500.training.optimizers import make
from tests.backends.test_batchnorm_training import batches, tiny

# TensorFlow and JAX take 20-30 s here to start and trace at load 4-8: slow, still run in CI
BACKENDS = [pytest.param(n, marks=pytest.mark.slow) if n in ("tensorflow", "jax") else n
            for n in [*backends.trainable(), "torch:compiled"]]
TORCH = ["torch", "torch:compiled"]


def worker_state(name: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """A worker's trainer stepped 3 times (parameters and running statistics off their initial
    values): its state, the feeds to predict on, and what it predicts. torch:compiled's worker
    is eager torch's (the same parameters, names and predictions; compiling its step takes
    minutes on a cold cache): its judge, the one tested, compiles nothing."""
    cls = backends.get("torch" if name == "torch:compiled" else name)
    ours = cls.prepare(tiny()).trainer(make("sgd", lr=0.1), loss="loss")
    for feeds in batches(3):
        ours.step(feeds, 0.1)
    assert ours.buffer_names  # the running statistics are part of every hand-over here
    x = {"input": batches(1, seed=1)[0]["input"]}
    return {**ours.parameters(), **ours.buffers()}, x, ours.predict(x)


def loaded(judge: trainer.Judge) -> dict[str, np.ndarray]:
    return {**judge.trainer.parameters(), **judge.trainer.buffers()}


@pytest.mark.parametrize("name", BACKENDS)
def test_every_backend_loads_a_hand_over_exactly(name):
    cls = backends.get(name)
    state, x, expected = worker_state(name)
    judge = trainer.Judge(cls, tiny())
    assert (judge.views is not None) == (name in TORCH)  # which path this backend takes
    before = loaded(judge)
    assert any(not np.array_equal(before[k], v) for k, v in state.items())
    judge.load({k: v.astype(np.float64) for k, v in state.items()})  # cast back on either path
    got = loaded(judge)
    assert set(got) == set(state)
    for k, v in state.items():
        assert got[k].dtype == v.dtype, k
        np.testing.assert_array_equal(got[k], v, err_msg=k)
    np.testing.assert_array_equal(judge.predict(x), expected)
    stat = judge.trainer.buffer_names[0]
    with pytest.raises(D500Error, match=rf"^the worker handed over '{stat}' as <U1, not as "
                                        rf"numbers$"):
        judge.load(dict(state, **{stat: np.full(state[stat].shape, "w")}))


@pytest.mark.parametrize("name", TORCH)
def test_views_and_set_parameters_give_the_same_judge(name):
    cls = backends.get(name)
    state, x, expected = worker_state(name)
    by_views, by_set = trainer.Judge(cls, tiny()), trainer.Judge(cls, tiny())
    by_set.views = None  # the other path, on the same backend
    assert by_views.views is not None
    for judge in (by_views, by_set):
        judge.load({k: v.astype(np.float64) for k, v in state.items()})
    a, b = loaded(by_views), loaded(by_set)
    for k in state:
        assert a[k].dtype == b[k].dtype
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    np.testing.assert_array_equal(by_views.predict(x), by_set.predict(x))
    np.testing.assert_array_equal(by_views.predict(x), expected)
