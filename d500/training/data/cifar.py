"""CIFAR-10: the python pickle batches, from `cifar-10-python.tar.gz` itself or its extracted
`cifar-10-batches-py/` folder, checked against their published digests and read into NumPy.

Each batch is a pickled dict with b"data" (uint8 [10000, 3072]: the red, green and blue 32x32
planes of each image, row-major, so already channels-first) and b"labels" (a list of 0..9).
The pickles are read by an unpickler that builds NumPy arrays and nothing else.
"""

from __future__ import annotations

import importlib
import io
import pickle
import tarfile
import zlib
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from d500.errors import DatasetError
from d500.training.data import registry

ARCHIVE = "cifar-10-python.tar.gz"


class _ArraysOnly(pickle.Unpickler):
    """An unpickler that can rebuild NumPy arrays and refuses every other global."""

    ALLOWED: ClassVar[set[tuple[str, str]]] = {
        ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed")
        if module == "numpy":
            return getattr(np, name)
        try:
            return getattr(importlib.import_module("numpy._core.multiarray"), name)
        except ImportError:  # NumPy 1.x
            return getattr(importlib.import_module("numpy.core.multiarray"), name)


def read_batch(raw: bytes, where: str) -> tuple[np.ndarray, np.ndarray]:
    """One pickled batch -> (images uint8 [N,3,32,32], labels int64 [N]); `where` names it in
    errors."""
    try:
        batch = _ArraysOnly(io.BytesIO(raw), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError,
            AttributeError, UnicodeDecodeError, OverflowError) as err:  # what damage raises
        raise DatasetError(f"{where}: not a CIFAR-10 python batch "
                           f"({type(err).__name__}: {err})") from None
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise DatasetError(f"{where}: not a CIFAR-10 python batch (no b'data' and b'labels')")
    data, labels = batch[b"data"], np.asarray(batch[b"labels"])
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2
            and data.shape[1] == 3 * 32 * 32):
        shape = getattr(data, "shape", None)
        raise DatasetError(f"{where}: b'data' is {type(data).__name__} {shape}, expected uint8 "
                           f"[N, 3072]")
    if labels.shape != (len(data),) or not np.issubdtype(labels.dtype, np.integer):
        raise DatasetError(f"{where}: {labels.size} b'labels' for {len(data)} images")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise DatasetError(f"{where}: a label outside 0..9")
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


def _read_archive(path: Path) -> dict[str, bytes]:
    wanted = {f"{registry.CIFAR_FOLDER}/{name}"
              for name in (*registry.CIFAR_TRAIN, registry.CIFAR_TEST)}
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(path, "r:gz") as tar:
            for member in tar:
                if member.name in wanted and member.isfile():
                    found[member.name] = tar.extractfile(member).read()  # type: ignore[union-attr]
    except (tarfile.TarError, OSError, EOFError, zlib.error) as err:
        raise DatasetError(f"{path}: cannot read it as a .tar.gz ({err})") from None
    for name in sorted(wanted - set(found)):
        raise DatasetError(f"{path}: the archive has no {name}")
    return found


def load(root: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """CIFAR-10 from a data directory, every file checked first: (train images uint8
    [50000,3,32,32], train labels int64, test images [10000,...], test labels)."""
    spec = registry.spec("cifar10")
    path = registry.resolve(spec, ARCHIVE, root)
    if path.is_dir():  # the extracted folder (resolve() checked each batch)
        def batch(name: str) -> tuple[np.ndarray, np.ndarray]:
            return read_batch((path / name).read_bytes(), str(path / name))
    else:
        members = _read_archive(path)

        def batch(name: str) -> tuple[np.ndarray, np.ndarray]:
            key = f"{registry.CIFAR_FOLDER}/{name}"
            return read_batch(members[key], f"{path}:{key}")

    train = [batch(name) for name in registry.CIFAR_TRAIN]
    x_test, y_test = batch(registry.CIFAR_TEST)
    x_train = np.concatenate([x for x, _ in train])
    y_train = np.concatenate([y for _, y in train])
    return x_train, y_train, x_test, y_test
