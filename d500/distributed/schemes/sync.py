"""Synchronous data-parallel SGD: every rank's gradients averaged by allreduce (fused into buckets,
or through a CompressedReducer), then the same update on every rank.

Bytes per step and rank, for a model of B bytes of float32 parameters at N ranks (traffic names
in parentheses):
- dense: one MPI Allreduce per bucket, counted as the ring: 2(N-1)/N * B sent and as many
  received ("allreduce"; "ring_allreduce" with ring=True; exact per bucket: comm.ring_counts);
- with a compressor of payload C bytes per rank (compression/__init__.py gives C per array; all
  arrays travel in one fused buffer): a summable one (none, fp16, randomk) is allreduced,
  2(N-1)/N * C each way ("allreduce"); the others (topk, qsgd, efsignsgd) are allgathered,
  (N-1) * C each way ("allgather"); powersgd allreduces its P and Q factors, 2(N-1)/N * C.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from d500.distributed.buckets import Buckets
from d500.distributed.schemes.base import Option, Scheme, register


@register
class Sync(Scheme):
    """Allreduce of the averaged gradients, then `apply` on every rank: every rank ends each step
    with the same parameters. Option `ring`: d500's ring allreduce (Sendrecv) instead of MPI's."""

    name = "sync"
    compressible = True
    options: ClassVar[dict[str, Option]] = {
        "ring": Option(False, "bool", "reduce with d500's ring allreduce, not MPI_Allreduce")}

    def __init__(self, trainer: Any, comm: Any, **kwargs: Any):
        super().__init__(trainer, comm, **kwargs)
        self.buckets: Buckets | None = None

    def step(self, feeds: Mapping[str, np.ndarray], lr: float, weight: float = 1.0
             ) -> float:
        loss, grads = self.gradients(feeds, weight)
        grads = self.average(grads)
        self.trainer.apply(grads, lr)
        self.steps += 1
        return loss

    def _finish(self) -> None:
        """The parameters are equal on every rank already; the running statistics (if any)
        become rank 0's, the ones its evaluations used."""
        self.broadcast_buffers(0)

    def average(self, grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The average over ranks of every rank's `grads`, in place where possible."""
        if self.reducer is not None:  # compressed even at 1 rank: its loss of accuracy counts
            return self.reducer.reduce(grads, inplace=True)[0]
        if self.size == 1:  # the average of one rank's gradients: nothing to copy or send
            return grads
        if self.buckets is None:
            self.buckets = Buckets(grads, self.bucket_bytes)
        self.buckets.allreduce(grads, self.comm, op="average", ring=self.ring)
        return grads
