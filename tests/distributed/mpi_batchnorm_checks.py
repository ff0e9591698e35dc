"""Batch normalisation's running statistics under the schemes on real MPI ranks, run by
test_batchnorm_mpi.py as `mpiexec -n N python mpi_batchnorm_checks.py [CHECK ...]` (the runner of
mpi_scheme_checks.py: one JSON line per check passed, the first failure ends the job).

A small conv + BatchNormalization network trains on (1, 8, 8) digits; each check compares every
rank's parameters AND running statistics with a one-process simulation of all the ranks.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from d500 import backends
from d500.builders import _Graph
from d500.distributed.comm import Communicator
from d500.distributed.schemes import make
from d500.training.optimizers.registry import make as make_optimizer

_spec = importlib.util.spec_from_file_location(
    "mpi_scheme_checks", Path(__file__).with_name("mpi_scheme_checks.py"))
base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(base)

CHECKS = {}
LR = 0.1
STATS = ["bn1.mean", "bn1.var"]


def check(fn):
    CHECKS[fn.__name__] = fn
    return fn


def model(seed: int = 0) -> onnx.ModelProto:
    """conv3x3(1->6) -> BatchNormalization -> Relu -> MaxPool -> Flatten -> Gemm(10), loss."""
    g = _Graph(seed)
    h = g.maxpool(g.relu(g.batchnorm(g.conv("input", 1, 6, 3, pad=1, bias=False), 6)))
    g.gemm(g.flatten(h), 6 * 4 * 4, 10, last=True)
    g.nodes[-1].output[0] = "logits"
    g.nodes.append(helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["loss"],
                                    reduction="mean"))
    graph = helper.make_graph(
        g.nodes, "conv_bn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 1, 8, 8]),
         helper.make_tensor_value_info("labels", TensorProto.INT64, ["N"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10]),
         helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], g.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def trainer(backend: str = "torch", seed: int = 0):
    exe = backends.get(backend).prepare(model(seed))
    t = exe.trainer(make_optimizer("sgd", lr=LR), loss="loss")
    assert t.buffer_names == STATS
    return t


def state(t) -> dict[str, np.ndarray]:
    return {**t.parameters(), **t.buffers()}


def close(a: dict[str, np.ndarray], b: dict[str, np.ndarray], rtol: float = 1e-5) -> float:
    """The largest per-array ||a - b|| / ||b||, asserted below `rtol`."""
    error = max(float(np.linalg.norm(a[k].astype(np.float64) - b[k]) / np.linalg.norm(b[k]))
                for k in b)
    assert error < rtol, error
    return error


def simulate_sync(steps: int, size: int) -> list:
    """Every rank as its own trainer in one process: gradients on its share (its statistics
    updated by its own batches), the average of the gradients applied by all."""
    ts = [trainer() for _ in range(size)]
    for k in range(steps):
        grads = [t.gradients(base.share(k, r, size))[1] for r, t in enumerate(ts)]
        mean = {n: np.mean([g[n] for g in grads], axis=0) for n in grads[0]}
        for t in ts:
            t.apply(mean, LR)
    return ts


def run(c: Communicator, name: str, steps: int, backend: str = "torch", **options):
    t = trainer(backend, seed=c.rank)  # start() must make every rank's model rank 0's
    c.reset()
    scheme = make(name, t, c, **options)
    scheme.start()
    for k in range(steps):
        scheme.step(base.share(k, c.rank, c.size), LR)
    return scheme, t


@check
def sync_keeps_running_statistics_per_rank_and_finishes_with_rank_0s(c: Communicator) -> dict:
    steps = 6
    scheme, t = run(c, "sync", steps)
    assert base.same_everywhere(c, t.parameters())
    assert not base.same_everywhere(c, t.buffers())  # each rank's own shares
    sim = simulate_sync(steps, c.size)
    error = close(state(t), state(sim[c.rank]))
    b = sum(a.nbytes for a in t.parameters().values())
    assert c.traffic["allreduce"].sent == steps * 4 * base.ring_counts(b // 4, c.size,
                                                                       c.rank)[0]
    scheme.finish()
    assert base.same_everywhere(c, t.buffers())
    close(t.buffers(), sim[0].buffers())
    stats = sum(a.nbytes for a in t.buffers().values())
    assert c.traffic["finish"].calls == 1, c.traffic  # one fused broadcast of the statistics
    assert c.traffic["finish"].sent + c.traffic["finish"].received >= stats, c.traffic
    return {"relative": error}


@check
def sync_on_tensorflow_and_reference_agrees(c: Communicator) -> dict:
    errors = {}
    for backend in ("tensorflow", "reference"):
        _, t = run(c, "sync", 3, backend)
        errors[backend] = close(state(t), state(simulate_sync(3, c.size)[c.rank]), 1e-4)
    return errors


@check
def local_sgd_averages_the_statistics_with_the_parameters(c: Communicator) -> dict:
    _, t = run(c, "local_sgd", 4, period=2)  # averaged after steps 2 and 4
    assert base.same_everywhere(c, state(t))
    ts = [trainer() for _ in range(c.size)]
    for k in range(4):
        for r, s in enumerate(ts):
            s.step(base.share(k, r, c.size), LR)
        if k % 2 == 1:
            mean = {n: np.mean([state(s)[n] for s in ts], axis=0) for n in state(ts[0])}
            for s in ts:
                s.set_parameters({n: v for n, v in mean.items() if n not in STATS})
                s.set_buffers({n: mean[n] for n in STATS})
    return {"relative": close(state(t), state(ts[0]))}


@check
def ps_and_dpsgd_move_the_statistics_with_the_model(c: Communicator) -> dict:
    _, t = run(c, "ps", 3)
    assert base.same_everywhere(c, state(t))  # rank 0's model, statistics included
    scheme, t = run(c, "dpsgd", 3)
    with scheme.evaluated():  # the average of the ranks' models
        assert base.same_everywhere(c, state(t))
        inside = t.buffers()
    assert not base.same_everywhere(c, t.buffers()) or c.size == 2  # restored after
    scheme.finish()
    assert base.same_everywhere(c, state(t))
    close(t.buffers(), inside)
    return {}


@check
def ddp_keeps_running_statistics_per_rank(c: Communicator) -> dict:
    from d500.distributed.ddp import DDPScheme
    steps = 4
    t = trainer()
    ddp = DDPScheme(t, c, timeout=30.0)
    ddp.start()
    for k in range(steps):
        ddp.step(base.share(k, c.rank, c.size), LR)
    assert base.same_everywhere(c, t.parameters())
    error = close(state(t), state(simulate_sync(steps, c.size)[c.rank]))
    ddp.finish()
    assert base.same_everywhere(c, t.buffers())
    return {"relative": error}


if __name__ == "__main__":
    base.CHECKS.clear()
    base.CHECKS.update(CHECKS)
    sys.exit(base.main())
