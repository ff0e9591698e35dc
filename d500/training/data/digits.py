"""The embedded default dataset: scikit-learn's digits (1,797 real 8x8 images of the digits 0-9,
values 0..16), shipped in the d500 wheel and read with NumPy alone.

`digits.csv.gz` is a byte-for-byte copy of scikit-learn's `sklearn/datasets/data/digits.csv.gz`
(scikit-learn 1.9.1; BSD 3-Clause licence, (c) the scikit-learn developers). The data are the
test part of the UCI "Optical Recognition of Handwritten Digits" set (Alpaydin & Kaynak, 1998;
CC BY 4.0). One row per image: 64 pixel values, then the label.
"""

from __future__ import annotations

import gzip
import hashlib
from importlib import resources

import numpy as np

FILE = "digits.csv.gz"
SAMPLES, CLASSES = 1797, 10


def raw_bytes() -> bytes:
    """The shipped file, as stored in the package."""
    return resources.files(__package__).joinpath(FILE).read_bytes()


def sha256() -> str:
    return hashlib.sha256(raw_bytes()).hexdigest()


def load() -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [1797, 1, 8, 8] with values 0..16, labels int64 [1797])."""
    with gzip.open(resources.files(__package__).joinpath(FILE).open("rb")) as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.uint8)
    return table[:, :-1].reshape(-1, 1, 8, 8), table[:, -1].astype(np.int64)
