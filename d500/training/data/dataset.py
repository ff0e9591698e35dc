"""The Dataset the trainer consumes and `load(name)`, which reads one by name: the embedded digits
or a checked file dataset from a data directory (--data DIR or $D500_DATA); `parts` gives a
workload's splits of either those or a shipped text corpus (d500.training.data.lm).

How each dataset is normalised (to float32, NCHW), decided here once for every workload:
- digits: values 0..16 divided by 16 (exact in float32), so inputs lie in [0, 1];
- mnist, fashion-mnist: bytes divided by 255, inputs in [0, 1] (the usual MNIST recipe; a
  dataset-wide mean/std standardisation is an affine change the first layer can absorb);
- cifar10: per-channel standardisation, (x - mean_c) / std_c, with mean and std computed from
  the *training split* only (never validation or test data), as common ResNet-20 recipes do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from d500.errors import DatasetError
from d500.training.data import corpora, registry

IMAGES = ("digits", "mnist", "fashion-mnist", "cifar10")  # what `load` reads
# token-sequence corpora (d500.training.data.lm): the shipped one, and those read from files
TEXT = ("python-stdlib", *corpora.NAMES)
KNOWN = (*IMAGES, *TEXT)
# (C, H, W) of a sample and the number of classes: what a model is built for before any data
# is touched (the trainer's clock starts after the model is built).
SHAPES = {"digits": ((1, 8, 8), 10), "mnist": ((1, 28, 28), 10),
          "fashion-mnist": ((1, 28, 28), 10), "cifar10": ((3, 32, 32), 10)}


@dataclass(frozen=True)
class Normalization:
    """x -> (x - mean[c]) / std[c] per channel c, in float32."""

    kind: str  # "scale" (a fixed divisor) or "standardize" (statistics of the training split)
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def apply(self, x: np.ndarray, chunk: int = 4096) -> np.ndarray:
        """A float32 copy of x [N, C, H, W], normalised (in chunks: no float64 temporary)."""
        out = np.empty(x.shape, np.float32)
        mean = np.asarray(self.mean, np.float32).reshape(1, -1, 1, 1)
        std = np.asarray(self.std, np.float32).reshape(1, -1, 1, 1)
        for i in range(0, len(x), chunk):
            np.subtract(x[i:i + chunk], mean, out=out[i:i + chunk], dtype=np.float32)
            out[i:i + chunk] /= std
        return out

    def describe(self) -> dict:
        return {"kind": self.kind, "mean": list(self.mean), "std": list(self.std)}


@dataclass
class Dataset:
    """A classification dataset held in memory: the training pool (the official training files,
    or every sample when the dataset has no official test set) and the official test set."""

    name: str
    x: np.ndarray  # raw values, uint8 [N, C, H, W]
    y: np.ndarray  # int64 [N]
    num_classes: int
    normalization: str  # "scale" or "standardize"
    scale: float = 1.0  # the divisor of "scale"
    test_x: np.ndarray | None = None  # the official test set, when there is one
    test_y: np.ndarray | None = None
    files: dict[str, str] = field(default_factory=dict)  # file read -> "sha256:<hex>" it matched

    @property
    def input_shape(self) -> tuple[int, ...]:
        """(C, H, W) of one sample."""
        return tuple(self.x.shape[1:])

    @property
    def has_official_test(self) -> bool:
        return self.test_x is not None

    def normalizer(self, train_x: np.ndarray) -> Normalization:
        """The normalisation for a split whose training inputs are `train_x` (raw)."""
        channels = self.x.shape[1]
        if self.normalization == "scale":
            return Normalization("scale", (0.0,) * channels, (float(self.scale),) * channels)
        # Sums of byte values in float64 are exact (< 2**53), so E[x^2] - E[x]^2 loses nothing;
        # chunks keep the float64 copy small (CIFAR-10's training split is 150 MB of bytes).
        total, squares = np.zeros(channels), np.zeros(channels)
        for i in range(0, len(train_x), 1024):
            chunk = train_x[i:i + 1024].astype(np.float64)
            total += chunk.sum(axis=(0, 2, 3))
            squares += np.square(chunk).sum(axis=(0, 2, 3))
        count = len(train_x) * train_x.shape[2] * train_x.shape[3]
        mean = total / count
        std = np.sqrt(np.maximum(squares / count - mean ** 2, 0.0))
        if not np.all(std > 0):
            raise DatasetError(f"{self.name}: a channel of the training split is constant; "
                               f"cannot standardise it")
        return Normalization("standardize", tuple(map(float, mean)), tuple(map(float, std)))


def _from_files(name: str, root: Path | None) -> Dataset:
    spec = registry.spec(name)
    if root is None:
        raise DatasetError(f"dataset '{name}' is read from files: give --data DIR or set "
                           f"D500_DATA; {registry.how_to_get(spec)}")
    if name == "cifar10":
        from d500.training.data import cifar
        x, y, tx, ty = cifar.load(root)
        kind, scale = "standardize", 1.0
    else:
        from d500.training.data import idx
        x, y, tx, ty = idx.load(name, root)
        kind, scale = "scale", 255.0
    return Dataset(name, x, y, 10, kind, scale, tx, ty, registry.provenance(spec, root))


def load(name: str, data_dir: str | os.PathLike | None = None) -> Dataset:
    """The dataset `name` ("digits", "mnist", "fashion-mnist" or "cifar10"). File datasets are
    read from `data_dir`, else $D500_DATA, each file checked against its published digest; a
    missing or wrong file is a one-line DatasetError saying how to get it."""
    if name == "digits":
        from d500.training.data import digits
        x, y = digits.load()
        return Dataset("digits", x, y, digits.CLASSES, "scale", 16.0,
                       files={digits.FILE: f"sha256:{digits.sha256()}"})
    if name in TEXT:
        raise DatasetError(f"'{name}' is a text corpus, read as windows of tokens "
                           f"(d500.training.data.lm), not as a dataset of samples")
    if name not in IMAGES:
        raise DatasetError(f"unknown dataset '{name}' (known: {', '.join(IMAGES)})")
    return _from_files(name, registry.data_dir(data_dir))


def text_spec(fields: dict[str, Any]) -> Any:
    """The TextSpec of a workload's `dataset` fields (a text corpus)."""
    from d500.training.data.lm import TextSpec
    return TextSpec(fields["name"], fields["train"], fields["validation"], fields["test"],
                    fields.get("split_seed", 0), fields["context"], fields["vocab"],
                    fields.get("tokens_sha256"))


def shape_of(dataset: str | dict[str, Any]) -> tuple[tuple[int, ...], int]:
    """((C, H, W), classes) of an image dataset, or ((context,), vocabulary) of a text corpus
    (given as the workload's `dataset` fields), without reading it."""
    name = dataset if isinstance(dataset, str) else dataset["name"]
    if name in TEXT:
        if isinstance(dataset, str) or dataset.get("context") is None:
            raise DatasetError(f"text corpus '{name}' needs its context and vocab fields")
        return (int(dataset["context"]),), int(dataset["vocab"])
    if name not in SHAPES:
        raise DatasetError(f"unknown dataset '{name}' (known: {', '.join(KNOWN)})")
    return SHAPES[name]


def train_layout(fields: dict[str, Any]
                 ) -> tuple[dict[str, tuple[int, ...]], dict[str, np.dtype]] | None:
    """The shapes and dtypes of a workload's training split ("x": float32 [N, C, H, W], "y":
    int64 [N], as `parts` gives it), known before any data is read; None for a text corpus."""
    if fields["name"] not in SHAPES:
        return None
    count = int(fields["train"])
    return ({"x": (count, *SHAPES[fields["name"]][0]), "y": (count,)},
            {"x": np.dtype(np.float32), "y": np.dtype(np.int64)})


def parts(fields: dict[str, Any], data_dir: str | os.PathLike | None = None
          ) -> tuple[Any, dict[str, str]]:
    """The Splits of a workload's `dataset` fields and the files read ("name": "sha256:<hex>"):
    samples split by d500.training.data.splits, or a text corpus's windows (lm.splits)."""
    from d500.training.data.splits import split
    if fields["name"] in TEXT:
        from d500.training.data import lm
        return lm.splits(text_spec(fields), data_dir)
    from d500.training.data.splits import SplitSpec
    ds = load(fields["name"], data_dir)
    spec = SplitSpec(fields["train"], fields["validation"], fields["test"],
                     fields.get("split_seed", 0))
    return split(ds, spec), ds.files


def check_present(name: str | dict[str, Any], data_dir: str | os.PathLike | None = None
                  ) -> None:
    """A check before a run is recorded: a file dataset's directory is given and holds every
    published file (or its unpacked form); digests are checked when it is loaded. A missing
    dataset is a one-line DatasetError saying how to get it. A text corpus (given as the
    workload's `dataset` fields) is checked and its tokens prepared (d500.training.data.lm), so
    that no run's clock includes training its tokenizer."""
    if not isinstance(name, str):
        if name["name"] in TEXT:
            from d500.training.data import lm
            lm.prepare(text_spec(name), data_dir)
            return
        name = name["name"]
    if name == "digits":
        return
    spec = registry.spec(name)
    root = registry.data_dir(data_dir)
    if root is None:
        raise DatasetError(f"dataset '{name}' is read from files: give --data DIR or set "
                           f"D500_DATA; {registry.how_to_get(spec)}")
    for file in spec.files:
        if not registry.present(spec, file.name, root):
            registry.resolve(spec, file.name, root)  # raises the one-line error naming it
        registry.check_size(spec, file, root)  # a garbled file: said now, not in a failed run
