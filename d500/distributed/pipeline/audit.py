"""The judge's check that the ranks trained on every sample of the batches it ordered: the loss
they report for the first step after a hand-over is recomputed by the judge, on the model they
handed over and the whole global batch of that step (which it draws from the training split and
the run's seed itself), and must agree to TOLERANCE.

A pipeline spreads one step over ranks that run the entry's code; a stage that skipped half of
its micro-batches would finish sooner and still be credited with the whole batch (the judge
counts samples as the steps it ordered x the global batch). Its reported loss is then the loss of
the micro-batches it kept, which is not the whole batch's: the run is recorded failed, naming the
step. What this does not see: a rank that runs the forward of every micro-batch (the loss is
right) and skips backwards, or one honest exactly at the audited steps (the first after each
evaluation); a run whose updates part from one process's is `d500 reproduce`'s to find.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from d500.errors import D500Error

TOLERANCE = 1e-4  # relative: one float32 loss summed in another order (measured ~1e-7)


class Audit:
    """Held by the judge's side of the ranks (judge.Ranks): `given` the training split,
    `check` each chunk's first loss where the judge holds the model of the step before it."""

    def __init__(self, model: Any, global_batch: int, seed: int, drop_last: bool):
        self.model, self.batch, self.seed, self.drop_last = model, global_batch, seed, drop_last
        self.sampler: Any = None
        self.holds: tuple[int, int] | None = None  # (epoch, step) the judge's model is before
        self.audited = 0

    def given(self, x: np.ndarray, y: np.ndarray) -> None:
        from d500.training.data.samplers import EpochSampler
        self.x, self.y = x, y
        self.sampler = EpochSampler(len(y), self.batch, self.seed, self.drop_last)

    def check(self, epoch: int, first: int, losses: list[float], handed: bool) -> None:
        """A D500Error unless the first of `losses` (steps first.. of `epoch`) is the loss of
        its global batch on the model the judge holds, where it holds the model before it."""
        if self.holds == (epoch, first) and losses and math.isfinite(losses[0]):
            index = list(self.sampler.epoch(epoch))[first]
            own = float(self.model.predict({"input": self.x[index], "labels": self.y[index]},
                                           "loss"))
            if not abs(losses[0] - own) <= TOLERANCE * max(abs(own), 1e-12):
                raise D500Error(
                    f"audit: the ranks reported loss {losses[0]:.6g} for step {first + 1} of "
                    f"epoch {epoch + 1}; the judge's model (the one they handed over) gives "
                    f"{own:.6g} on that step's whole global batch of {len(index)} samples: "
                    f"the ranks did not train on every sample they were given")
            self.audited += 1
        end = first + len(losses)
        if end == len(self.sampler):
            epoch, end = epoch + 1, 0
        self.holds = (epoch, end) if handed else None
