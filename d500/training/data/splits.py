"""Fixed splits: a workload's train, validation and test sizes and split seed -> three normalised
parts, the same for the same (dataset, sizes, seed) on every machine.

The held-out test part comes from the official test files when the dataset has them (MNIST,
Fashion-MNIST, CIFAR-10), else from the samples (digits). Samples are taken from one seeded
permutation in a fixed order (test first when drawn from the samples, then validation, then
train), so growing the training size never changes the validation or test samples.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from d500.errors import ConfigError
from d500.training.data import shuffle
from d500.training.data.dataset import Dataset, Normalization


@dataclass(frozen=True)
class SplitSpec:
    """The split a workload fixes."""

    train: int
    validation: int
    test: int
    seed: int

    def __post_init__(self) -> None:
        for name in ("train", "validation", "test", "seed"):
            value = getattr(self, name)
            lowest = 0 if name == "seed" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < lowest:
                raise ConfigError(f"split.{name}: expected an integer >= {lowest}, got {value!r}")


@dataclass
class Part:
    """One split: normalised inputs (float32 [N, C, H, W]), labels (int64 [N]) and the indices
    of its samples in their source (the training pool, or the official test set)."""

    x: np.ndarray
    y: np.ndarray
    indices: np.ndarray

    def __len__(self) -> int:
        return len(self.y)


@dataclass
class Splits:
    dataset: str
    spec: SplitSpec
    train: Part
    validation: Part
    test: Part
    normalization: Normalization

    def fingerprint(self) -> str:
        """sha256 over the dataset name and the three index lists: equal iff the split is."""
        h = hashlib.sha256(self.dataset.encode())
        for part in (self.train, self.validation, self.test):
            h.update(b"|" + np.ascontiguousarray(part.indices, np.int64).tobytes())
        return h.hexdigest()


def indices(dataset: Dataset, spec: SplitSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (train, validation, test) sample indices, each sorted; the test indices point into the
    official test set when the dataset has one. Sizes that do not fit are a ConfigError."""
    pool = len(dataset.y)
    if dataset.has_official_test:
        available = len(dataset.test_y)  # type: ignore[arg-type]
        if spec.test > available:
            raise ConfigError(f"split.test: {spec.test} exceeds the {available} samples of "
                              f"{dataset.name}'s official test set")
        if spec.train + spec.validation > pool:
            raise ConfigError(f"split: train {spec.train} + validation {spec.validation} = "
                              f"{spec.train + spec.validation} exceeds the {pool} training "
                              f"samples of {dataset.name}")
        test = shuffle.permutation(available, "split-test", spec.seed)[:spec.test]
        order, used = shuffle.permutation(pool, "split", spec.seed), 0
    else:
        total = spec.train + spec.validation + spec.test
        if total > pool:
            raise ConfigError(f"split: train {spec.train} + validation {spec.validation} + test "
                              f"{spec.test} = {total} exceeds the {pool} samples of "
                              f"{dataset.name}")
        order = shuffle.permutation(pool, "split", spec.seed)
        test, used = order[:spec.test], spec.test
    validation = order[used:used + spec.validation]
    train = order[used + spec.validation:used + spec.validation + spec.train]
    return np.sort(train), np.sort(validation), np.sort(test)


def split(dataset: Dataset, spec: SplitSpec) -> Splits:
    """The three parts of `dataset` under `spec`, normalised by `dataset.normalizer` fitted on
    the training part alone."""
    train, validation, test = indices(dataset, spec)
    x_train = dataset.x[train]
    norm = dataset.normalizer(x_train)
    test_x = dataset.test_x if dataset.has_official_test else dataset.x
    test_y = dataset.test_y if dataset.has_official_test else dataset.y
    return Splits(
        dataset.name, spec,
        Part(norm.apply(x_train), dataset.y[train], train),
        Part(norm.apply(dataset.x[validation]), dataset.y[validation], validation),
        Part(norm.apply(test_x[test]), test_y[test], test),  # type: ignore[index]
        norm)
