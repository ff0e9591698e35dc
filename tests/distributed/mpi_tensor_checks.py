"""Tensor parallelism on real MPI ranks, run by test_tensor_mpi.py as
`mpiexec -n 2 python mpi_tensor_checks.py [CHECK ...]` (mpi_scheme_checks.main: one JSON line per
check passed, the first failure ends the job): the digits MLP and a small transformer language
model split 2 ways ({tensor: 2}; at 4 ranks {data: 2, tensor: 2}), trained for STEPS steps with
momentum, give one process's losses on the same batches within 1e-5 relative, and the whole
model gathered to rank 0 (as the judge receives it) equals one process's parameters.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from mpi_scheme_checks import CHECKS, check, digits, main, relative  # noqa: E402

from d500 import backends  # noqa: E402
from d500.builders import build, build_lm  # noqa: E402
from d500.distributed.comm import Communicator  # noqa: E402
from d500.distributed.grid import Grid  # noqa: E402
from d500.distributed.spec import parse  # noqa: E402
from d500.distributed.tensor.scheme import build as tensor  # noqa: E402
from d500.training.optimizers.registry import make as make_optimizer  # noqa: E402

CHECKS.clear()  # this file's checks only
STEPS = 15
LR = 0.1
CONTEXT, VOCAB = 8, 16


def mlp_batches() -> list[dict[str, np.ndarray]]:
    x, y = digits()
    return [{"input": x[i * 32:(i + 1) * 32], "labels": y[i * 32:(i + 1) * 32]}
            for i in range(STEPS)]


def lm_batches() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, VOCAB, (STEPS, 8, CONTEXT + 1))
    return [{"input": t[:, :-1], "labels": t[:, 1:]} for t in tokens]


def compare(c: Communicator, model, batches) -> dict:
    """TENSOR=2's losses and gathered model against one process's after STEPS steps."""
    spec = parse({"scheme": "sync", "tensor": 2}, "tensor.yaml")
    grid = Grid(c, spec.dims(c.size))
    opt = make_optimizer("momentum", lr=LR, momentum=0.9)
    scheme = tensor(model, spec, grid, backends.get("torch"), opt, False)
    scheme.start()
    d, n = grid.coords["data"], grid.sizes["data"]  # each data rank its equal share
    losses = [scheme.step({k: v[d * len(v) // n:(d + 1) * len(v) // n] for k, v in b.items()},
                          LR) for b in batches]
    if n > 1:  # the global batch's loss: the mean of the data ranks' shares' losses
        losses = list(c.mpi.allreduce(np.array(losses)) / c.size)
    with scheme.evaluated():
        state = scheme.handed() if c.rank == 0 else None
    one = backends.get("torch").prepare(model).trainer(
        make_optimizer("momentum", lr=LR, momentum=0.9))
    reference = [one.step(b, LR) for b in batches]
    out = agrees(c, losses, reference, state, one)
    assert losses[-1] < losses[0]  # it learns
    out.update(tensor_bytes=scheme.tp.traffic["allreduce"].sent,
               param_bytes=scheme.memory()["param_bytes"])
    if c.rank == 0:
        full = sum(a.nbytes for a in one.parameters().values())
        assert out["param_bytes"] < 0.6 * full, (out["param_bytes"], full)  # ~1/T of the split
    return out


def agrees(c: Communicator, losses: list[float], reference: list[float],
           state: dict[str, np.ndarray] | None, one) -> dict:
    """`losses` within 1e-5 relative of one process's `reference`, and on rank 0 the gathered
    `state` within 1e-5 of the one process `one`'s parameters: the figures of both."""
    loss_error = max(abs(a - b) / abs(b) for a, b in zip(losses, reference))
    assert loss_error < 1e-5, (losses, reference)
    out = {"loss_relative_error": loss_error, "first_loss": losses[0], "last_loss": losses[-1]}
    if c.rank == 0:
        whole = one.parameters()
        assert set(state) == set(whole), (sorted(state), sorted(whole))
        # the whole model's ||a - b|| / ||b|| (per weight, the key bias of attention is float
        # noise on both sides: its true gradient is 0, softmax being blind to a shift per query)
        out["param_relative_error"] = relative(flat(state), flat(whole))
        assert out["param_relative_error"] < 1e-5, out
    return out


def flat(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"all": np.concatenate([params[k].ravel() for k in sorted(params)])}


@check
def mlp_tensor_2_equals_one_process(c: Communicator) -> dict:
    return compare(c, build("mlp", (1, 8, 8), 10, seed=3, loss=True), mlp_batches())


@check
def transformer_tensor_2_equals_one_process(c: Communicator) -> dict:
    model = build_lm("transformer", CONTEXT, VOCAB, seed=3, loss=True, layers=2, width=32,
                     heads=2)
    return compare(c, model, lm_batches())


if __name__ == "__main__":
    sys.exit(main())
