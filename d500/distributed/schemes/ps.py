"""The consistent parameter server: rank 0 holds the model; every rank (rank 0 included: its share
of the global batch counts like any other) computes gradients, they are reduced to rank 0, rank 0
applies their average, then broadcasts the parameters and every rank adopts them.

Bytes per step and rank, model of B float32 bytes at N ranks (comm's chain conventions):
- "reduce" (MPI_Reduce to rank 0, per bucket): every rank but 0 sends B; every rank but N-1
  receives B;
- "broadcast" (MPI_Bcast from rank 0, per bucket): every rank but N-1 sends B; every rank but 0
  receives B.
So rank 0 sends B and receives B, ranks 1..N-2 send 2B and receive 2B, rank N-1 sends B and
receives B (at N = 2: B each way on both ranks).
With a compressor of payload C bytes: a summable one (none, fp16, randomk) is reduced to rank 0
("reduce": C sent by every rank but 0, C received by every rank but N-1); the others (topk,
qsgd, efsignsgd) are allgathered ("allgather": (N-1) * C each way), as sync does; powersgd, whose
second round needs the first round's sum on every rank, is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from d500.distributed.buckets import Buckets
from d500.distributed.schemes.base import Scheme, register
from d500.errors import ConfigError


@register
class ParameterServer(Scheme):
    """Gradients reduced to rank 0, rank 0's update, parameters broadcast: every rank ends each
    step with rank 0's parameters (the optimizer state lives on rank 0 only)."""

    name = "ps"
    compressible = True

    def __init__(self, trainer: Any, comm: Any, **kwargs: Any):
        super().__init__(trainer, comm, **kwargs)
        self.buckets: Buckets | None = None
        if self.reducer is not None:
            from d500.distributed.compression import CompressedReducer
            c = self.reducer.compressor
            if c.rounds > 1:
                raise ConfigError(f"scheme 'ps' cannot use compressor '{c.name}': its second "
                                  f"round needs the first round's sum on every rank (use "
                                  f"scheme 'sync')")
            self.reducer = CompressedReducer(
                c, self.reducer.memory, allreduce=self._reduce_to_root,
                allgather=comm.allgather, world=comm.size)

    def _reduce_to_root(self, buffer: np.ndarray) -> np.ndarray:
        return self.comm.reduce(buffer, 0, "sum")

    def step(self, feeds: Mapping[str, np.ndarray], lr: float, weight: float = 1.0
             ) -> float:
        loss, grads = self.gradients(feeds, weight)
        if self.reducer is not None:
            grads = self.reducer.reduce(grads, inplace=True)[0]  # the average on rank 0
        elif self.size > 1:
            if self.buckets is None:
                self.buckets = Buckets(grads, self.bucket_bytes)
            self.buckets.apply(grads, lambda buf: self.comm.reduce(buf, 0, "average"))
        if self.rank == 0:
            self.trainer.apply(grads, lr)
        if self.size > 1:
            self.broadcast_parameters(0)
        self.steps += 1
        return loss
