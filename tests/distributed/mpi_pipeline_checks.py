"""Pipeline parallelism on real MPI ranks, run by test_pipeline_mpi.py as
`mpiexec -n 2 python mpi_pipeline_checks.py [CHECK ...]` (mpi_scheme_checks.main: one JSON line per
check passed, the first failure ends the job): a model cut into 2 stages, one per rank, trained
with M micro-batches under GPipe and 1F1B, equals one process trained on the same global batches
(the whole model gathered to rank 0 as the judge receives it); the bubble is measured beside
its theory. At N ranks the pipeline has 2 stages and N/2 data ranks (4 ranks: data 2 x
pipeline 2, each stage's gradients averaged over its data pair).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from mpi_scheme_checks import CHECKS, check, digits, main, relative  # noqa: E402

from d500 import backends  # noqa: E402
from d500.builders import build  # noqa: E402
from d500.distributed.comm import Communicator  # noqa: E402
from d500.distributed.grid import Grid  # noqa: E402
from d500.distributed.pipeline.scheme import build as pipeline  # noqa: E402
from d500.distributed.spec import parse  # noqa: E402
from d500.training.data.samplers import PartitionedSampler  # noqa: E402
from d500.training.optimizers.registry import make as make_optimizer  # noqa: E402

CHECKS.clear()  # this file's checks only
STEPS = 20
LR = 0.1


def batches(batch: int, data_rank: int = 0, data_size: int = 1):
    sampler = PartitionedSampler(len(digits()[1]), batch, 0, data_rank, data_size)
    return list(sampler.shares(0))[:STEPS]


def feeds(index: np.ndarray) -> dict[str, np.ndarray]:
    x, y = digits()
    return {"input": x[index], "labels": y[index]}


def one_process(model, optimizer: str, batch: int, backend: str = "torch", **hp
                ) -> dict[str, np.ndarray]:
    t = backends.get(backend).prepare(model).trainer(make_optimizer(optimizer, lr=LR, **hp))
    for index, _ in batches(batch):
        t.step(feeds(index), LR)
    return t.parameters()


def piped(c: Communicator, model, distributed: dict, optimizer: str, batch: int,
          backend: str = "torch", **hp):
    """The pipeline's parameters after STEPS steps, gathered on rank 0 (None elsewhere), and
    the scheme."""
    spec = parse({"scheme": "sync", **distributed}, "pipeline.yaml")
    grid = Grid(c, spec.dims(c.size))
    scheme = pipeline(model, spec, grid, backends.get(backend),
                      make_optimizer(optimizer, lr=LR, **hp), False)
    scheme.start()
    for index, weight in batches(batch, grid.coords["data"], grid.sizes["data"]):
        scheme.step(feeds(index), LR, weight)
    with scheme.evaluated():
        state = scheme.handed() if c.rank == 0 else None
    return state, scheme


def _compare(c: Communicator, builder: str, schedule: str, optimizer: str, batch: int,
             micro: int, backend: str = "torch", **hp) -> dict:
    model = build(builder, (1, 8, 8), 10, seed=3, loss=True)
    state, scheme = piped(c, model, {"pipeline": 2, "micro_batches": micro,
                                     "schedule": schedule}, optimizer, batch, backend, **hp)
    gathered = scheme.pipe.traffic.get("evaluate")  # data coordinate 0's stages send theirs
    out = {"bubble_measured": scheme.figures()["bubble_measured"],
           "bubble_theory": scheme.figures()["bubble_theory"],
           "stash_bytes_peak": scheme.figures()["stash_bytes_peak"],
           "evaluate_bytes": gathered.sent + gathered.received if gathered else 0}
    if c.rank == 0:
        reference = one_process(model, optimizer, batch, backend, **hp)
        assert set(state) == set(reference), (sorted(state), sorted(reference))
        out["relative"] = relative(state, reference)
        assert out["relative"] <= 1e-5, out
        # the stage's own parameters are a part of the model; the rest came from stage 1
        assert set(scheme.stage.params) < set(state), scheme.stage.params
    assert 0.0 <= out["bubble_measured"] < 1.0, out
    # a step completes its sends after the next one's update; the evaluation settles them all
    assert scheme.sending == [], scheme.sending
    return out


@check
def gpipe_on_the_mlp_equals_one_process(c: Communicator) -> dict:
    return _compare(c, "mlp", "gpipe", "momentum", 32, 4, momentum=0.9)


@check
def one_f_one_b_on_lenet_equals_one_process(c: Communicator) -> dict:
    return _compare(c, "lenet5", "1f1b", "sgd", 32, 4)


@check
def unequal_micro_batches_weigh_by_size(c: Communicator) -> dict:
    """A global batch of 30 in 4 micro-batches (7, 8, 7, 8 samples)."""
    return _compare(c, "mlp", "1f1b", "adam", 30, 4)


@check
def the_reference_backend_pipelines_too(c: Communicator) -> dict:
    """Stages translated by another backend (NumPy: its own gradients(grad_outputs=...))."""
    return _compare(c, "mlp", "1f1b", "sgd", 32, 4, "reference")


@check
def one_f_one_b_stashes_less_than_gpipe(c: Communicator) -> dict:
    model = build("mlp", (1, 8, 8), 10, seed=3, loss=True)
    held = {}
    for schedule in ("gpipe", "1f1b"):
        _, scheme = piped(c, model, {"pipeline": 2, "micro_batches": 8, "schedule": schedule},
                          "sgd", 32)
        held[schedule] = scheme.figures()["stash_bytes_peak"]
    if c.rank == 0:  # stage 0 of 2: GPipe keeps 8 micro-batches' inputs, 1F1B 2
        assert held["1f1b"] * 4 == held["gpipe"], held
    return held


if __name__ == "__main__":
    main()
