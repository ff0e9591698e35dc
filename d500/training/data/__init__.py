"""Level-2 datasets: the embedded digits, checked MNIST/Fashion-MNIST/CIFAR-10 files, fixed
splits and seeded samplers (the trainer's whole view of data).

    ds = load("digits")                                    # or load("mnist", data_dir)
    parts = split(ds, SplitSpec(train=1200, validation=297, test=300, seed=0))
    sampler = EpochSampler(len(parts.train), batch_size=32, seed=1, drop_last=True)
    for idx in sampler.epoch(0):
        xb, yb = parts.train.x[idx], parts.train.y[idx]
"""

from __future__ import annotations

from d500.training.data.dataset import KNOWN, Dataset, Normalization, load
from d500.training.data.samplers import EpochSampler, PartitionedSampler
from d500.training.data.splits import Part, Splits, SplitSpec, split

__all__ = ["KNOWN", "Dataset", "EpochSampler", "Normalization", "Part", "PartitionedSampler",
           "SplitSpec", "Splits", "load", "split"]
