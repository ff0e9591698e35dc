"""The Trainer split (gradients + apply = step on torch, tensorflow, jax and reference; torch's
zero-copy param.grad and parameter views) and the schemes in one process: option and compressor
refusals, each scheme at 1 rank equal to plain training, evaluation traffic kept apart. The
multi-rank checks are in test_schemes_mpi.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from d500 import backends
from d500.builders import build
from d500.distributed.comm import Communicator
from d500.distributed.schemes import SCHEMES, make, make_reducer
from d500.distributed.schemes.server import Flat
from d500.errors import ConfigError, UsageError
from d500.training.optimizers.registry import make as make_optimizer

TRAINABLE = ["torch", "tensorflow", "jax", "reference"]
LR = 0.05


_spec = importlib.util.spec_from_file_location(
    "mpi_scheme_checks", Path(__file__).with_name("mpi_scheme_checks.py"))
_checks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_checks)


def feeds(steps: int, batch: int = 16) -> list[dict[str, np.ndarray]]:
    """Consecutive batches of sklearn's bundled 8x8 digits."""
    x, y = _checks.digits()
    return [{"input": x[k * batch:(k + 1) * batch], "labels": y[k * batch:(k + 1) * batch]}
            for k in range(steps)]


def trainer(backend: str = "torch", optimizer: str = "sgd", native: bool = False, seed: int = 0):
    exe = backends.get(backend).prepare(build("mlp", (1, 8, 8), 10, seed=seed, loss=True))
    return exe.trainer(make_optimizer(optimizer, lr=LR), loss="loss", native=native)


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray], rtol: float = 1e-6):
    assert a.keys() == b.keys()
    for k, value in a.items():
        np.testing.assert_allclose(value, b[k], rtol=rtol, atol=rtol * np.abs(b[k]).max(),
                                   err_msg=k)


# -- the Trainer split ----------------------------------------------------------------------
CASES = [(b, o, n) for b in TRAINABLE for o in ("sgd", "momentum", "adam")
         for n in ((False, True) if b != "reference" else (False,))]


@pytest.mark.parametrize(("backend", "optimizer", "native"), CASES)
def test_gradients_then_apply_equals_step(backend, optimizer, native):
    batches = feeds(8)
    stepped, split = trainer(backend, optimizer, native), trainer(backend, optimizer, native)
    losses = [stepped.step(f, LR) for f in batches]
    split_losses = []
    for f in batches:
        loss, grads = split.gradients(f)
        assert isinstance(loss, float)
        assert all(g.flags.writeable and g.dtype == np.float32 for g in grads.values())
        split.apply(grads, LR)
        split_losses.append(loss)
    np.testing.assert_allclose(split_losses, losses, rtol=1e-6)
    assert_same(split.parameters(), stepped.parameters())
    assert losses[-1] < losses[0]


def test_torch_gradients_are_views_of_param_grad():
    t = trainer("torch")
    before = t.parameters()
    _, grads = t.gradients(feeds(1)[0])
    for name, p in zip(t.names, t.params):
        assert grads[name].ctypes.data == p.grad.data_ptr()
        assert np.abs(grads[name]).max() > 0
        grads[name] *= 0  # what an in-place allreduce would do: param.grad changes with it
        assert float(p.grad.abs().max()) == 0
    t.apply(grads, LR)
    assert_same(t.parameters(), before, rtol=0)


def test_apply_takes_arrays_that_are_not_views():
    a, b = trainer("torch"), trainer("torch")
    f = feeds(1)[0]
    _, grads = a.gradients(f)
    a.apply(grads, LR)
    _, grads = b.gradients(f)
    b.apply({k: np.array(v) for k, v in grads.items()}, LR)
    assert_same(a.parameters(), b.parameters(), rtol=0)


def test_parameter_views():
    t = trainer("torch")
    views = t.parameter_views()
    name = t.names[0]
    views[name][...] = 0.25
    assert np.all(t.parameters()[name] == 0.25)
    assert trainer("reference").parameter_views() is None
    assert trainer("tensorflow").parameter_views() is None


@pytest.mark.parametrize("backend", TRAINABLE)
def test_apply_refuses_missing_or_misshapen_gradients(backend):
    t = trainer(backend)
    _, grads = t.gradients(feeds(1)[0])
    name = next(iter(grads))
    with pytest.raises(UsageError, match=f"no gradient for parameter '{name}'"):
        t.apply({k: v for k, v in grads.items() if k != name}, LR)
    with pytest.raises(UsageError, match=f"the gradient of '{name}' has shape"):
        t.apply({**grads, name: grads[name].reshape(-1)[:3]}, LR)


# -- schemes in one process -----------------------------------------------------------------
def test_registry_and_unknown_scheme():
    assert set(SCHEMES) == {"sync", "ps", "ssp", "async_ps", "dpsgd", "local_sgd"}
    with pytest.raises(UsageError, match="unknown scheme 'allreduce' \\(known: .*sync"):
        make("allreduce", trainer(), Communicator.single())


@pytest.mark.parametrize(("name", "options", "message"), [
    ("local_sgd", {"period": 0}, "option 'period' must be a whole number >= 1, got 0"),
    ("local_sgd", {"period": 2.0}, "option 'period' must be a whole number >= 1, got 2.0"),
    ("async_ps", {"max_staleness": -1}, "option 'max_staleness' must be a whole number >= 0"),
    ("sync", {"ring": "yes"}, "option 'ring' must be true or false, got 'yes'"),
    ("dpsgd", {"lian": 1}, "option 'lian' must be true or false"),
    ("sync", {"period": 4}, "unknown option 'period' \\(options: ring\\)"),
    ("ps", {"ring": True}, "unknown option 'ring' \\(options: none\\)"),
    ("sync", {"bucket_bytes": 0}, "bucket_bytes must be a whole number of bytes >= 1"),
])
def test_options_are_validated(name, options, message):
    with pytest.raises(ConfigError, match=f"scheme '{name}'.*{message}"):
        make(name, trainer(), Communicator.single(), **options)


@pytest.mark.parametrize(("name", "options", "message"), [
    ("ssp", {"staleness": -1}, "option 'staleness' must be a whole number >= 0, got -1"),
    ("local_sgd", {"period": 0}, "option 'period' must be a whole number >= 1, got 0"),
    ("sync", {"ring": "yes"}, "option 'ring' must be true or false, got 'yes'")])
def test_an_entrys_option_values_are_checked_as_its_file_is_read(name, options, message):
    """ssp's staleness -1 passed the file's checks and failed inside rank 0 once the run's
    progress bar was up, a line without the file; now the file's check says it, every rank."""
    from d500.distributed.spec import parse
    with pytest.raises(ConfigError, match=f"^e.yaml: field 'distributed.options' of scheme "
                                          f"'{name}': {message}$"):
        parse({"scheme": name, "options": options}, "e.yaml")


@pytest.mark.parametrize("name", ["dpsgd", "local_sgd", "async_ps"])
def test_schemes_without_compression_refuse_a_compressor(name):
    c = Communicator.single()
    with pytest.raises(ConfigError, match=f"scheme '{name}' does not compress gradients "
                                          f"\\(compression works with: .*ps.*sync"):
        make(name, trainer(), c, reducer=make_reducer(c, "topk"))


def test_ps_refuses_powersgd():
    c = Communicator.single()
    with pytest.raises(ConfigError, match="scheme 'ps' cannot use compressor 'powersgd'"):
        make("ps", trainer(), c, reducer=make_reducer(c, "powersgd"))


@pytest.mark.parametrize(("name", "options"), [
    ("sync", {}), ("sync", {"ring": True}), ("ps", {}), ("dpsgd", {}), ("dpsgd", {"lian": True}),
    ("local_sgd", {"period": 3}), ("async_ps", {}), ("async_ps", {"max_staleness": 0})])
@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_one_rank_is_plain_training(backend, name, options):
    batches = feeds(6)
    plain = trainer(backend, "momentum")
    for f in batches:
        plain.step(f, LR)
    c = Communicator.single()
    scheme = make(name, trainer(backend, "momentum", seed=1), c, **options)
    scheme.start()  # one rank: its own parameters stay (seed 1)
    losses = [scheme.step(f, LR) for f in batches]
    scheme.finish()
    assert all(np.isfinite(losses)) and scheme.steps == len(batches)
    assert c.bytes_sent == c.bytes_received == 0
    reference = trainer(backend, "momentum", seed=1)
    for f in batches:
        reference.step(f, LR)
    assert_same(scheme.trainer.parameters(), reference.parameters())
    if name == "async_ps":
        f = scheme.figures()
        assert f["staleness_max"] == 0 and f["gradients_applied"] == len(batches)
        assert scheme.details() == {"staleness_histogram": [len(batches)]}


def test_sync_with_fp16_reports_the_compression_ratio():
    c = Communicator.single()
    scheme = make("sync", trainer(), c, reducer=make_reducer(c, "fp16"))
    scheme.start()
    for f in feeds(3):
        scheme.step(f, LR)
    dense = sum(a.nbytes for a in scheme.trainer.parameters().values())
    assert scheme.figures() == {"payload_bytes_per_step": dense / 2, "compression_ratio": 2.0}


def test_evaluation_traffic_is_counted_apart():
    c = Communicator.single()
    scheme = make("local_sgd", trainer(), c, period=3)
    scheme.start()
    for f in feeds(4):  # averaged after step 3; step 4 is local
        scheme.step(f, LR)
    before = {k: (t.calls, t.seconds) for k, t in c.traffic.items()}
    held = c.traffic["allreduce"]
    own = scheme.trainer.parameters()
    with scheme.evaluated():
        c.allreduce(np.ones(3, np.float32))  # the caller's own collective inside: evaluation
    assert {k: (t.calls, t.seconds) for k, t in c.traffic.items() if k != "evaluate"} == before
    assert c.traffic["evaluate"].calls == 2 and held is c.traffic["allreduce"]
    assert_same(scheme.trainer.parameters(), own, rtol=0)


def test_flat_layout_round_trip():
    arrays = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(4, np.float32)}
    flat = Flat(arrays)
    assert flat.nbytes == 16 + 4 * 10
    buffer = flat.buffer()
    flat.pack(buffer, arrays, version=7, lr=0.125)
    assert Flat.header(buffer) == (7, 0.125)
    views = flat.views(buffer)
    assert all(np.array_equal(views[k], arrays[k]) for k in arrays)
    with pytest.raises(ConfigError, match="float32 parameters; 'w' is float64"):
        Flat({"w": np.zeros(2)})
