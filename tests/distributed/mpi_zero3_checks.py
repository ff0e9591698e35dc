"""ZeRO stage 3 on real MPI ranks, run by test_zero3_mpi.py as `mpiexec -n 2 python
mpi_zero3_checks.py [CHECK ...]` (mpi_scheme_checks.main: one JSON line per check passed): its
losses and parameters against sync's over 20 steps, the parameter storage each rank really holds
between steps (measured on the torch tensors), its bytes, and the model gathered for evaluation.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mpi_parallel_checks import run  # noqa: E402  (steps on this rank's weighted shares)
from mpi_scheme_checks import CHECKS, check, main, relative, same_everywhere, trainer  # noqa: E402

from d500.builders import build  # noqa: E402
from d500.distributed.comm import Communicator, gather_counts  # noqa: E402
from d500.distributed.schemes import make  # noqa: E402
from d500.distributed.schemes.zero import Zero, shard_bytes  # noqa: E402
from d500.distributed.spec import parse  # noqa: E402

CHECKS.clear()  # this file's checks only
STEPS = 20


@check
def zero3_matches_sync_and_holds_its_block(c: Communicator) -> dict:
    hp = {"weight_decay": 1e-4}
    sync = make("sync", trainer(optimizer="adam", seed=c.rank, **hp), c)
    want_losses = run(c, sync, STEPS)
    sync.finish()
    want = sync.trainer.parameters()
    b = sum(a.nbytes for a in want.values())
    c.reset()
    zero = Zero(trainer(optimizer="adam", seed=c.rank, **hp), c, stage=3)
    losses = run(c, zero, STEPS)
    loss_error = max(abs(a - w) / abs(w) for a, w in zip(losses, want_losses))
    assert loss_error < 1e-5, (losses, want_losses)
    # between steps this rank's tensors hold its block's storage only, measured
    block = 4 * zero.counts[c.rank]
    held = sum(t.untyped_storage().nbytes() for t in zero.tensors.values())
    assert held == block < b, (held, block, b)
    assert all(t.grad is None for t in zero.tensors.values())
    memory = zero.memory()
    assert memory["param_bytes"] == memory["grad_bytes"] == block, memory
    assert 2 * block <= memory["optimizer_bytes"] <= 2 * block + 64, memory
    assert zero.figures()["peak_param_bytes"] == b
    judged = shard_bytes(build("mlp", (1, 8, 8), 10, seed=0, loss=True),
                         parse({"scheme": "sync", "shard": "zero3"}, "e.yaml"), c.size)
    assert judged[c.rank] == block  # the judge's own figure of this rank's block
    blocks = [4 * n for n in zero.counts]
    g, rs = c.traffic["allgatherv"], c.traffic["reduce_scatter"]
    assert (g.sent, g.received) == tuple(STEPS * v for v in gather_counts(blocks, c.rank)), g
    assert (rs.sent, rs.received) == (STEPS * (b - blocks[c.rank]),
                                       STEPS * (b - blocks[(c.rank + 1) % c.size])), rs
    with zero.evaluated():  # the whole model gathered for the judge, freed after
        whole = zero.trainer.parameters()
        assert relative(whole, want) < 1e-5
    assert sum(t.untyped_storage().nbytes() for t in zero.tensors.values()) == block
    assert c.traffic["evaluate"].calls == 1
    zero.finish()
    mine = zero.trainer.parameters()
    assert same_everywhere(c, mine)
    error = relative(mine, want)
    assert error < 1e-5, error
    return {"loss_relative_to_sync": loss_error, "params_relative_to_sync": error,
            "held_bytes": held, "model_bytes": b, **memory}


@check
def zero3_stale_shard_parts_from_sync(c: Communicator) -> dict:
    """The attack: rank 1 skips its block's update (a stale shard); the losses part from sync's
    within the 20 steps, which is what the judge's audit and `reproduce` see."""
    sync = make("sync", trainer(seed=c.rank), c)
    want = run(c, sync, STEPS)
    zero = Zero(trainer(seed=c.rank), c, stage=3)
    if c.rank == 1:
        zero.state = None  # its update is skipped: the block stays as it started
    losses = run(c, zero, STEPS)
    error = max(abs(a - w) / abs(w) for a, w in zip(losses, want))
    assert error > 1e-3, error
    return {"loss_relative_to_sync": error}


if __name__ == "__main__":
    sys.exit(main())
