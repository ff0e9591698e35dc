"""Decentralized parallel SGD (D-PSGD, Lian et al. 2017) on a ring: every rank takes a local step,
then replaces its MODEL (not its gradient) by the average of itself and its ring neighbours.

The mixing matrix W is the uniform average over each rank's closed ring neighbourhood, symmetric
and doubly stochastic at every P:
- P >= 3: x_i <- (x_{i-1} + x_i + x_{i+1}) / 3;
- P = 2:  x_i <- (x_0 + x_1) / 2 (both neighbours are the same rank, counted once: W = [[1/2,
  1/2], [1/2, 1/2]]; summing it twice would give [[1/3, 2/3], [2/3, 1/3]]);
- P = 1:  x_0 <- x_0 (plain SGD).
Order (option `lian`): by default adapt then combine, x_i <- sum_j W_ij (x_j - lr g_j(x_j)) (the
local step is the Trainer's own fused step); with lian: true, Lian et al.'s Algorithm 1 exactly:
the gradient at x_i, then x_i <- sum_j W_ij x_j - lr g_i(x_i). The optimizer state stays local.

Bytes per step and rank, model of B float32 bytes: P >= 3: "neighbour_exchange", B to each
neighbour and B from each, 2B each way; P = 2: one allreduce of the model, (x_0 + x_1) / 2,
counted 2(P-1)/P * B = B each way ("allreduce"); P = 1: none.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

import numpy as np

from d500.distributed.buckets import Buckets
from d500.distributed.schemes.base import Option, Scheme, register


@register
class DPSGD(Scheme):
    """A local step, then the ring average of the models (see the module docstring for W)."""

    name = "dpsgd"
    options: ClassVar[dict[str, Option]] = {
        "lian": Option(False, "bool", "Lian et al.'s order: gradient, mix the models, update")}

    def __init__(self, trainer: Any, comm: Any, **kwargs: Any):
        super().__init__(trainer, comm, **kwargs)
        self.buckets: Buckets | None = None
        self._received: list[tuple[np.ndarray, np.ndarray]] = []

    def step(self, feeds: Mapping[str, np.ndarray], lr: float, weight: float = 1.0
             ) -> float:
        if self.lian:
            loss, grads = self.gradients(feeds, weight)  # at x_i, before the mixing
            self.mix()
            self.trainer.apply(grads, lr)
        else:
            loss = self.local_step(feeds, lr, weight)
            self.mix()
        self.steps += 1
        return loss

    def mix(self) -> None:
        """x_i <- sum_j W_ij x_j over the ring (W above), in place in the model."""
        if self.size == 1:
            return
        if self.size == 2:
            self.average_parameters()
            return
        arrays = self.params.get()
        if self.buckets is None:
            self.buckets = Buckets(arrays, self.bucket_bytes)
        packed = self.buckets.pack(arrays)
        if not self._received:
            self._received = [(np.empty_like(b), np.empty_like(b)) for b in packed]
        for buf, (left, right) in zip(packed, self._received):
            self.comm.neighbour_exchange(buf, left, right)
            np.add(buf, left, out=buf)  # ((x_i + x_{i-1}) + x_{i+1}) / 3
            np.add(buf, right, out=buf)
            np.divide(buf, 3, out=buf)
        self.buckets.unpack(arrays)
        self.params.put(arrays)

    def _finish(self) -> None:
        """The final model is the average of the ranks' models (one allreduce)."""
        if self.size > 2 or (self.size == 2 and self.lian):  # P = 2 ATC: already equal
            self.average_parameters()

    def figures(self) -> dict[str, float]:
        """consensus_distance: ||x_i - mean x|| / ||mean x|| at the last evaluation."""
        if self.consensus_distance != self.consensus_distance:  # no evaluation yet
            return {}
        return {"consensus_distance": self.consensus_distance}

    @contextmanager
    def _evaluate(self) -> Iterator[None]:
        """The average of all ranks' models (the consensus D-PSGD's models approach)."""
        with self.averaged_model():
            yield
