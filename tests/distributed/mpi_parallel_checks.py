"""Level 3 beyond plain data parallelism, on real MPI ranks, run by test_parallel_mpi.py as
`mpiexec -n 2 python mpi_parallel_checks.py [CHECK ...]` (mpi_scheme_checks.main: one JSON line per
check passed, the first failure ends the job): the grid's per-dimension communicators, unequal
shares weighted by their size, the stale-synchronous parameter server (s = 0 is ps; its bound
held and reached), ZeRO stages 1 and 2 against sync (parameters, bytes, memory per rank).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from mpi_scheme_checks import (  # noqa: E402  (the scheme checks' runner and helpers)
    CHECKS,
    LR,
    check,
    digits,
    main,
    relative,
    same_everywhere,
    trainer,
)

from d500.distributed.comm import Communicator, gather_counts, ring_counts  # noqa: E402
from d500.distributed.grid import Grid  # noqa: E402
from d500.distributed.schemes import make  # noqa: E402
from d500.distributed.schemes.zero import Zero  # noqa: E402
from d500.distributed.spec import parse  # noqa: E402
from d500.errors import UsageError  # noqa: E402
from d500.training.data.samplers import PartitionedSampler  # noqa: E402

CHECKS.clear()  # this file's checks only
BATCH = 9  # a global batch 2 ranks share unequally (4 and 5)


def shares(c: Communicator, steps: int) -> list[tuple[np.ndarray, float]]:
    """This rank's (indices, weight) of the first `steps` global batches of BATCH."""
    sampler = PartitionedSampler(len(digits()[1]), BATCH, 0, c.rank, c.size)
    return list(sampler.shares(0))[:steps]


def feeds(index: np.ndarray) -> dict[str, np.ndarray]:
    x, y = digits()
    return {"input": x[index], "labels": y[index]}


def single_process(steps: int, optimizer: str = "sgd", **hp) -> dict[str, np.ndarray]:
    """One process on the whole global batches of `shares` (one rank's PartitionedSampler)."""
    t = trainer(optimizer=optimizer, **hp)
    for index, _ in shares(Communicator.single(), steps):
        t.step(feeds(index), LR)
    return t.parameters()


def run(c: Communicator, scheme, steps: int, weighted: bool = True, pause: float = 0.0):
    """`steps` steps of `scheme` on this rank's shares (sleeping `pause` s before each)."""
    scheme.start()
    losses = []
    for index, weight in shares(c, steps):
        time.sleep(pause)
        losses.append(scheme.step(feeds(index), LR, weight if weighted else 1.0))
    return losses


@check
def grid_has_a_communicator_per_dimension(c: Communicator) -> dict:
    for dims in ({"data": 2}, {"pipeline": 2}, {"tensor": 2}):
        key = next(iter(dims))
        grid = Grid(c, {"data": 1, "pipeline": 1, "tensor": 1, **dims})
        assert grid.coords[key] == c.rank, grid.coords
        assert getattr(grid, key).size == 2, key
        for other in {"data", "pipeline", "tensor"} - {key}:
            assert getattr(grid, other).size == 1 and grid.coords[other] == 0, other
        x = np.array([float(c.rank + 1)])
        getattr(grid, key).allreduce(x)
        assert x[0] == 3.0, x  # both ranks of the dimension summed
        grid.free()
    grid = Grid(c, parse({"scheme": "sync"}, "e.yaml").dims(c.size))
    assert grid.data is c  # a flat scheme: the data dimension is the world, unsplit
    try:
        parse({"scheme": "sync", "data": 3}, "e.yaml").dims(c.size)
    except UsageError as err:
        assert "3 x 1 x 1 must equal the world size 2" in str(err), err
    else:
        raise AssertionError("data 3 at 2 ranks was accepted")
    return {}


@check
def unequal_shares_weighted_equal_one_process(c: Communicator) -> dict:
    steps = 12
    reference = single_process(steps)
    out = {}
    for name in ("sync", "ps"):
        for weighted in (True, False):
            scheme = make(name, trainer(seed=c.rank), c)
            run(c, scheme, steps, weighted)
            scheme.finish()
            mine = scheme.trainer.parameters()
            assert same_everywhere(c, mine), name
            out[f"{name}_{'weighted' if weighted else 'equal'}"] = relative(mine, reference)
        assert out[f"{name}_weighted"] < 1e-5, out
        assert out[f"{name}_equal"] > 1e-4, out  # the fault the weights fix is visible
    return out


@check
def ssp_with_staleness_0_is_ps(c: Communicator) -> dict:
    steps = 12
    ps = make("ps", trainer(optimizer="momentum", momentum=0.9, seed=c.rank), c)
    run(c, ps, steps)
    ps.finish()
    ssp = make("ssp", trainer(optimizer="momentum", momentum=0.9, seed=c.rank), c, staleness=0)
    run(c, ssp, steps)
    with ssp.evaluated():
        error = relative(ssp.trainer.parameters(), ps.trainer.parameters())
        assert same_everywhere(c, ssp.trainer.parameters())
    ssp.finish()
    assert error < 1e-6, error
    figures = ssp.figures()
    if c.rank == 0:
        assert figures["staleness_max"] == 0 and figures["gradients_applied"] == steps * c.size
    return {"relative_to_ps": error}


@check
def ssp_keeps_and_reaches_its_bound(c: Communicator) -> dict:
    """Rank 1 slower (it sleeps before each step): rank 0 runs ahead until it misses s clocks,
    never more; every rank's own view agrees, and the model learns."""
    steps, s = 16, 2
    scheme = make("ssp", trainer(seed=c.rank), c, staleness=s)
    scheme.start()
    seen = []  # a worker's staleness of each of its gradients, from its own view
    for k, (index, weight) in enumerate(shares(c, steps), start=1):
        time.sleep(0.03 * c.rank)
        scheme.step(feeds(index), LR, weight)
        if c.rank:
            seen.append(k - 1 - scheme.version)  # the version it computed step k on
    scheme.finish()
    assert max(seen, default=0) <= s, seen
    everyone = c.mpi.gather(seen, root=0)
    figures = scheme.figures()
    if c.rank == 0:
        assert figures["staleness_max"] == s, figures  # the slow rank held rank 0 back at s
        assert figures["gradients_applied"] == steps * c.size
        missing = Counter(v for r in everyone for v in r) - Counter(scheme.stale)
        assert not missing, (everyone, scheme.stale)  # the server saw what the workers did
    assert same_everywhere(c, scheme.trainer.parameters())
    return {"staleness_max": figures.get("staleness_max"),
            "staleness_mean": figures.get("staleness_mean")}


@check
def zero_stages_match_sync_and_shard_memory(c: Communicator) -> dict:
    steps = 10
    hp = {"weight_decay": 1e-4}
    sync = make("sync", trainer(optimizer="adam", seed=c.rank, **hp), c)
    run(c, sync, steps)
    sync.finish()
    want = sync.trainer.parameters()
    b = sum(a.nbytes for a in want.values())
    out = {"sync_memory": sync.memory()}
    for stage in (1, 2):
        c.reset()
        zero = Zero(trainer(optimizer="adam", seed=c.rank, **hp), c, stage=stage)
        run(c, zero, steps)
        zero.finish()
        mine = zero.trainer.parameters()
        assert same_everywhere(c, mine), stage
        error = relative(mine, want)
        assert error < 1e-5, (stage, error)
        memory = zero.memory()
        block = 4 * zero.counts[c.rank]
        assert memory["param_bytes"] == b
        assert memory["grad_bytes"] == (b if stage == 1 else block), memory
        # Adam's two moments over this rank's block (and a step counter), not the whole model
        assert 2 * block <= memory["optimizer_bytes"] <= 2 * block + 64, memory
        assert memory["optimizer_bytes"] < 0.75 * out["sync_memory"]["optimizer_bytes"], memory
        blocks = [4 * n for n in zero.counts]
        gathered = c.traffic["allgatherv"]
        assert (gathered.sent, gathered.received) == tuple(
            steps * v for v in gather_counts(blocks, c.rank)), gathered
        if stage == 1:
            sent, received = ring_counts(b // 4, c.size, c.rank)
            assert c.traffic["allreduce"].sent == steps * 4 * sent
        else:
            t = c.traffic["reduce_scatter"]
            assert (t.sent, t.received) == (steps * (b - blocks[c.rank]),
                                            steps * (b - blocks[(c.rank + 1) % c.size])), t
        out[f"zero{stage}"] = {"relative_to_sync": error, **memory}
    return out


if __name__ == "__main__":
    sys.exit(main())
