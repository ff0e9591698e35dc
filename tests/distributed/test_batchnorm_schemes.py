"""Batch normalisation's running statistics in the schemes, in one process: each scheme at 1 rank
(and the DDP baseline) trains them as plain training does; `Parameters` carries them beside the
parameters. The multi-rank checks are in test_batchnorm_mpi.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from d500.distributed.comm import Communicator
from d500.distributed.schemes import Parameters, make

_spec = importlib.util.spec_from_file_location(
    "mpi_batchnorm_checks", Path(__file__).with_name("mpi_batchnorm_checks.py"))
checks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(checks)
LR = checks.LR


def batches(steps: int) -> list[dict[str, np.ndarray]]:
    return [checks.base.share(k, 0, 1) for k in range(steps)]


def plain(backend: str, steps: int, seed: int = 1) -> dict[str, np.ndarray]:
    t = checks.trainer(backend, seed=seed)
    for f in batches(steps):
        t.step(f, LR)
    return checks.state(t)


@pytest.mark.parametrize(("name", "options"), [
    ("sync", {}), ("ps", {}), ("dpsgd", {}), ("local_sgd", {"period": 2}), ("async_ps", {})])
@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_one_rank_trains_the_statistics_as_plain_training(backend, name, options):
    t = checks.trainer(backend, seed=1)
    c = Communicator.single()
    scheme = make(name, t, c, **options)
    scheme.start()
    for f in batches(5):
        scheme.step(f, LR)
    with scheme.evaluated():
        pass
    scheme.finish()
    assert c.bytes_sent == c.bytes_received == 0
    checks.close(checks.state(t), plain(backend, 5))
    assert not np.allclose(t.buffers()["bn1.var"], 1.0)  # they moved


def test_ddp_baseline_at_one_rank_trains_the_statistics():
    from d500.distributed.ddp import DDPScheme
    t = checks.trainer("torch", seed=1)
    ddp = DDPScheme(t, Communicator.single())
    ddp.start()
    for f in batches(5):
        ddp.step(f, LR)
    ddp.finish()
    checks.close(checks.state(t), plain("torch", 5))


@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_parameters_carry_the_running_statistics(backend):
    t = checks.trainer(backend)
    params = Parameters(t)
    arrays = params.get()
    assert sorted(arrays) == sorted([*t.parameter_names, *t.buffer_names])
    arrays["bn1.mean"][:] = 3.0
    arrays["fc1.bias"][:] = 2.0
    params.put(arrays)
    assert (t.buffers()["bn1.mean"] == 3.0).all() and (t.parameters()["fc1.bias"] == 2.0).all()
