"""Local SGD (model averaging; Stich 2019, Lin et al. 2020 "Don't use large mini-batches"): every
rank takes `period` ordinary local steps (the level-2 Trainer's own fused step), then the ranks'
models are averaged. The optimizer state (momentum, Adam moments) stays local, as in those papers.

Bytes per averaging step and rank, model of B float32 bytes at N ranks: the fused allreduce of
the parameters, 2(N-1)/N * B each way ("allreduce"); 0 on the other steps. Per step on average:
2(N-1)/N * B / period each way. With period 1 and plain SGD it is the sync scheme: the average of
x - lr g_i over ranks is x - lr * mean(g_i).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import ClassVar

import numpy as np

from d500.distributed.schemes.base import Option, Scheme, register


@register
class LocalSGD(Scheme):
    """`period` local steps, then the models averaged by allreduce."""

    name = "local_sgd"
    options: ClassVar[dict[str, Option]] = {
        "period": Option(4, "count", "local steps between two averagings of the models (H)")}

    def step(self, feeds: Mapping[str, np.ndarray], lr: float, weight: float = 1.0
             ) -> float:
        loss = self.local_step(feeds, lr, weight)
        self.steps += 1
        if self.steps % self.period == 0:
            self.average_parameters()
        return loss

    @contextmanager
    def _evaluate(self) -> Iterator[None]:
        """The average of the ranks' models (between averagings they differ; right after one
        they are equal and nothing is sent)."""
        if self.steps % self.period == 0:
            yield
            return
        with self.averaged_model():
            yield

    def _finish(self) -> None:
        """The final model is the average (sent only if the last step did not average)."""
        if self.steps % self.period:
            self.average_parameters()

    def figures(self) -> dict[str, float]:
        out = {"averagings": float(self.steps // self.period)}
        if self.consensus_distance == self.consensus_distance:  # set by an evaluation
            out["consensus_distance"] = self.consensus_distance
        return out
