"""The worker's next chunk, readied while it waits for the judge's word: the epoch's batches
(d500.training.data.samplers) and the first step's rows gathered (d500.training.worker's loop).

    ahead = Ahead(x, y, seed, drop_last=True)
    ahead.guess(epoch=0, first=0, batch=32)        # while the worker waits: the likely chunk
    for feeds in ahead.chunk(0, 0, count=37, batch=32):  # what the judge asked for, exactly
        trainer.step(feeds, lr)
    ahead.after(0, 0, 37, 32)                      # the chunk that likely follows, readied

A guess decides nothing: `chunk` gives the batches of the epoch, first step, count and batch
the judge's message names, the same whatever was guessed, and uses what a guess readied only
where the guess was that very chunk. The worker would otherwise sleep there (the judge loads the
data, validates): readied then, the epoch's order (~0.1-0.3 ms at load 9-13, digits-mlp) and the
first rows no longer follow the judge's word on the clock, as they did in the worker and still do
in the loop before the split (README "What the split costs"). What it keeps between chunks, code
in the worker can reach, as it could reach the loop's list of batches before: a kept batch of
another size than the judge asked for fails the run (Changed; tests/training/test_ahead.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from d500.errors import ConfigError
from d500.training.data import shuffle
from d500.training.data.samplers import EpochSampler


class Changed(RuntimeError):
    """A batch kept between chunks is not of the size the judge asked for (code in the worker,
    the entry's, changed it): the run fails."""


class Ahead:
    """The training split's batches as the judge asks for them, the likely next one readied."""

    def __init__(self, x: Any, y: Any, seed: int, drop_last: bool):
        self.x, self.y, self.seed, self.drop_last = x, y, seed, drop_last
        self.made: dict[tuple[int, int], list[np.ndarray]] = {}  # (epoch, batch) -> batches
        self.fed: tuple[tuple[int, int, int], dict[str, Any]] | None = None  # a guess's rows

    def batches(self, epoch: int, batch: int) -> list[np.ndarray]:
        """Every batch of `epoch` at `batch` samples (the sampler's; the last two kept)."""
        key = (epoch, batch)
        got = self.made.get(key)
        if got is None:
            got = list(EpochSampler(len(self.y), batch, self.seed, self.drop_last).epoch(epoch))
            self.made = {k: v for k, v in self.made.items() if k[0] >= epoch - 1}
            self.made[key] = got
        return got

    def chunk(self, epoch: int, first: int, count: int, batch: int
              ) -> Iterator[dict[str, Any]]:
        """The feeds of steps first..first+count-1 of `epoch` at `batch` samples, each
        gathered as it is reached (a guess's rows in the first one's place, where the guess was
        this very chunk); Changed where a kept batch is not of `batch` samples."""
        fed, self.fed = self.fed, None
        size = len(self.y)
        for k, index in enumerate(self.batches(epoch, batch)[first:first + count], first):
            if len(index) != min(batch, size - k * batch):  # cut or grown in the worker
                raise Changed(f"step {k + 1} of epoch {epoch + 1} would train {len(index)} "
                              f"samples, not the {batch} the judge asked for: the worker's "
                              f"batches were changed")
            if k == first and fed is not None and fed[0] == (epoch, first, batch) \
                    and len(fed[1]["labels"]) == len(index):
                yield fed[1]
            else:
                yield {"input": self.x[index], "labels": self.y[index]}

    def guess(self, epoch: int, first: int, batch: int) -> None:
        """Ready the chunk from step `first` of `epoch` at `batch`: its epoch's batches, its
        first step's rows gathered (a batch the sampler refuses: nothing readied)."""
        try:
            indices = self.batches(epoch, batch)
        except ConfigError:
            return
        if first < len(indices):
            index = indices[first]
            self.fed = ((epoch, first, batch), {"input": self.x[index], "labels": self.y[index]})

    def after(self, epoch: int, first: int, count: int, batch: int) -> None:
        """Ready the chunk that follows steps first..first+count-1 of `epoch` at `batch`: the
        rest of the epoch, else the next one from its start, at the same batch."""
        if first + count < len(self.batches(epoch, batch)):
            self.guess(epoch, first + count, batch)
        else:
            self.guess(epoch + 1, 0, batch)


def warm(size: int) -> None:
    """Before the clock: the permutation code the sampler runs, run once on `size` indices
    under a key no epoch uses (its result dropped), so that the first chunk's order is computed
    warm, as in the judge's process, which ran it as it split the data (cold in the worker: 0.33
    ms against 0.12 at load 8-12, digits-mlp)."""
    shuffle.permutation(max(int(size), 1), "warm-up")
