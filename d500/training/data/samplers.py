"""Seeded samplers: index batches of one epoch, a fresh permutation per epoch fixed by
(seed, epoch) alone, with `drop_last` as the workload says; and a partitioned variant for data
parallelism (level 3) in which every rank computes the same permutation and takes its share.

    sampler = EpochSampler(len(train), batch_size=64, seed=seed, drop_last=True)
    for epoch in range(epochs):
        for idx in sampler.epoch(epoch):
            step(train.x[idx], train.y[idx])   # cheap: indices into preloaded arrays
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from d500.errors import ConfigError
from d500.training.data import shuffle


def _integer(name: str, value: object, lowest: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < lowest:
        raise ConfigError(f"{name}: expected an integer >= {lowest}, got {value!r}")
    return int(value)


class EpochSampler:
    """Batches of sample indices (int64 arrays) over range(size), reshuffled every epoch."""

    def __init__(self, size: int, batch_size: int, seed: int, drop_last: bool = False,
                 shuffle: bool = True):
        self.size = _integer("sampler size", size, 1)
        self.batch_size = _integer("batch_size", batch_size, 1)
        self.seed = _integer("seed", seed, 0)
        self.drop_last, self.shuffle = bool(drop_last), bool(shuffle)
        if self.drop_last and self.batch_size > self.size:
            raise ConfigError(f"batch_size: {self.batch_size} exceeds the {self.size} training "
                              f"samples, so drop_last leaves no batch")

    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(self.size, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    @property
    def samples_per_epoch(self) -> int:
        return len(self) * self.batch_size if self.drop_last else self.size

    def order(self, epoch: int) -> np.ndarray:
        """Every index once, in the order of this epoch."""
        epoch = _integer("epoch", epoch, 0)
        if not self.shuffle:
            return np.arange(self.size, dtype=np.int64)
        return shuffle.permutation(self.size, "epoch", self.seed, epoch)

    def epoch(self, epoch: int) -> Iterator[np.ndarray]:
        """The batches of one epoch (views of its order; the last one shorter unless dropped)."""
        order = self.order(epoch)
        for i in range(len(self)):
            yield order[i * self.batch_size:(i + 1) * self.batch_size]


class PartitionedSampler:
    """Rank `rank` of `world`: every global batch of the EpochSampler with the same size,
    batch_size, seed and drop_last is cut into `world` contiguous shares (sizes differ by at
    most one) and this rank gets share `rank`. All ranks take the same number of steps; the
    union of their shares of a step is the global batch, so N ranks together see exactly what
    one process sees."""

    def __init__(self, size: int, batch_size: int, seed: int, rank: int, world: int,
                 drop_last: bool = False, shuffle: bool = True):
        self.world = _integer("world size", world, 1)
        self.rank = _integer("rank", rank, 0)
        if self.rank >= self.world:
            raise ConfigError(f"rank: {self.rank} is not below the world size {self.world}")
        self.sampler = EpochSampler(size, batch_size, seed, drop_last, shuffle)
        if self.sampler.batch_size < self.world:
            raise ConfigError(f"batch_size: the global batch {self.sampler.batch_size} is "
                              f"smaller than the {self.world} ranks sharing it")

    def __len__(self) -> int:
        return len(self.sampler)

    def epoch(self, epoch: int) -> Iterator[np.ndarray]:
        for share, _ in self.shares(epoch):
            yield share

    def shares(self, epoch: int) -> Iterator[tuple[np.ndarray, float]]:
        """This rank's share of each global batch and its weight: len(share) * world /
        len(batch), so that the mean over ranks of weight x (the share's mean gradient) is the
        global batch's mean gradient when the world does not divide the batch (1.0 when it
        does)."""
        for batch in self.sampler.epoch(epoch):
            start = self.rank * len(batch) // self.world
            share = batch[start:(self.rank + 1) * len(batch) // self.world]
            yield share, len(share) * self.world / len(batch)
