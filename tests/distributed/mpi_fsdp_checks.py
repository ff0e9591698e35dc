"""The torch FSDP2 baseline (d500.distributed.fsdp) on real MPI ranks, run by test_fsdp_mpi.py as
`mpiexec -n 2 python mpi_fsdp_checks.py` (mpi_scheme_checks.main): its losses and final
parameters against d500's sync over 20 steps of unequal weighted shares, the full model rank 0
hands the judge, each rank's local shard and its bytes."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mpi_parallel_checks import run  # noqa: E402  (steps on this rank's weighted shares)
from mpi_scheme_checks import CHECKS, check, main, relative, same_everywhere, trainer  # noqa: E402

from d500.distributed.comm import Communicator  # noqa: E402
from d500.distributed.fsdp import FSDPScheme  # noqa: E402
from d500.distributed.schemes import make  # noqa: E402

CHECKS.clear()  # this file's checks only
STEPS = 20


@check
def fsdp_matches_sync_and_holds_its_shard(c: Communicator) -> dict:
    hp = {"momentum": 0.9, "weight_decay": 1e-4}
    sync = make("sync", trainer(optimizer="momentum", seed=c.rank, **hp), c)
    want_losses = run(c, sync, STEPS)
    sync.finish()
    want = sync.trainer.parameters()
    b = sum(a.nbytes for a in want.values())
    fsdp = FSDPScheme(trainer(optimizer="momentum", seed=c.rank, **hp), c)
    losses = run(c, fsdp, STEPS)
    loss_error = max(abs(a - w) / abs(w) for a, w in zip(losses, want_losses))
    assert loss_error < 1e-5, (losses, want_losses)
    with fsdp.evaluated():
        handed = fsdp.handed() if c.rank == 0 else None
    if c.rank == 0:
        assert relative({k: handed[k] for k in want}, want) < 1e-5
    memory = fsdp.memory()  # Shard(0) of each tensor, padded to N equal rows: about B / N
    assert b / c.size <= memory["param_bytes"] < 0.55 * b, (memory, b)
    assert fsdp.traffic.sent == STEPS * 3 * (c.size - 1) * memory["param_bytes"]
    fsdp.finish()
    mine = fsdp.trainer.parameters()
    assert same_everywhere(c, mine)
    error = relative(mine, want)
    assert error < 1e-5, error
    return {"loss_relative_to_sync": loss_error, "params_relative_to_sync": error,
            "model_bytes": b, **memory}


if __name__ == "__main__":
    sys.exit(main())
