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
from mpi_scheme_checks import (  # noqa: E402
    CHECKS,
    LR,
    check,
    main,
    relative,
    same_everywhere,
    trainer,
)

from d500.builders import build  # noqa: E402
from d500.distributed.comm import Communicator, gather_counts  # noqa: E402
from d500.distributed.schemes import make  # noqa: E402
from d500.distributed.schemes.zero import Zero, shard_bytes  # noqa: E402
from d500.distributed.schemes.zero3 import Zero3, peak_bytes  # noqa: E402
from d500.distributed.schemes.zero3 import shard_bytes as shard_bytes3  # noqa: E402
from d500.distributed.spec import parse  # noqa: E402
from d500.training.optimizers.registry import make as make_optimizer  # noqa: E402

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
def zero3_by_layer_matches_sync_and_holds_the_judges_peak(c: Communicator) -> dict:
    """Per-layer ZeRO-3, prefetching and one layer at a time: its losses and final parameters
    equal sync's over 20 unequal steps, its measured peak parameter bytes are its rows plus two
    layers (prefetching) or the largest (not), and the judge's figures from the graph equal what
    it holds."""
    from d500 import backends
    hp = {"weight_decay": 1e-4}
    sync = make("sync", trainer(optimizer="adam", seed=c.rank, **hp), c)
    want_losses = run(c, sync, STEPS)
    sync.finish()
    want = sync.trainer.parameters()
    c.reset()
    zero2 = Zero(trainer(optimizer="adam", seed=c.rank, **hp), c, stage=2)
    run(c, zero2, 2)
    c.reset()
    mlp = build("mlp", (1, 8, 8), 10, seed=c.rank, loss=True)  # rank 0's reaches every rank
    zero = Zero3(mlp, backends.get("torch"), make_optimizer("adam", lr=LR, **hp), c,
                 prefetch=True)
    losses = run(c, zero, STEPS)
    loss_error = max(abs(a - w) / abs(w) for a, w in zip(losses, want_losses))
    assert loss_error < 1e-5, (losses, want_losses)
    spec = parse({"scheme": "sync", "shard": "zero3", "options": {"prefetch": True}}, "e.yaml")
    figures = zero.figures()
    mine = sum(a.nbytes for a in zero.trainer.parameters().values())  # its rows, measured
    assert figures["param_bytes"] == mine == shard_bytes3(mlp, spec, c.size)[c.rank], figures
    assert figures["peak_param_bytes"] == peak_bytes(mlp, spec, c.size)[c.rank], figures
    g, rs = c.traffic["allgatherv"], c.traffic["reduce_scatter"]
    assert g.calls == STEPS * (2 * len(zero.layers) - 1) and rs.calls == STEPS * len(zero.layers)
    c.reset()
    alone = Zero3(mlp, backends.get("torch"), make_optimizer("adam", lr=LR, **hp), c)
    alone_error = max(abs(a - w) / abs(w) for a, w in zip(run(c, alone, STEPS), want_losses))
    assert alone_error < 1e-5, alone_error
    one = parse({"scheme": "sync", "shard": "zero3"}, "e.yaml")  # one at a time: the default
    peak = alone.figures()["peak_param_bytes"]
    assert peak == peak_bytes(mlp, one, c.size)[c.rank] < figures["peak_param_bytes"], peak
    with zero.evaluated():
        if c.rank == 0:
            assert relative(zero.handed(), want) < 1e-5
    zero.finish()
    error = relative(zero.trainer.parameters(), want)
    assert error < 1e-5 and same_everywhere(c, zero.trainer.parameters()), error
    return {"loss_relative_to_sync": loss_error, "params_relative_to_sync": error,
            "one_at_a_time_loss_relative_to_sync": alone_error,
            "peak_param_bytes": figures["peak_param_bytes"], "one_at_a_time_peak": peak,
            "zero2_peak_param_bytes": zero2.figures()["peak_param_bytes"],
            "param_bytes": figures["param_bytes"], "layers": len(zero.layers)}


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
