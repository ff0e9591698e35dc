"""MNIST and Fashion-MNIST: their four IDX files (gzipped or not), checked and read into NumPy.

An IDX file is a big-endian header, two zero bytes, a type code (0x08: unsigned byte), the
number of dimensions, one 32-bit size per dimension, then the values: images are 0x00000803
(3 dimensions: count, rows, columns), labels 0x00000801 (1 dimension).
"""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np

from d500.errors import DatasetError
from d500.training.data import registry

IMAGES_MAGIC, LABELS_MAGIC = 0x00000803, 0x00000801
UBYTE = 0x08


def read(path: Path, dimensions: int) -> np.ndarray:
    """One IDX file of unsigned bytes with this many dimensions (a `.gz` file is decompressed);
    a file that is not one, or is shorter or longer than its header says, is a DatasetError."""
    path = Path(path)
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                raw = f.read()
        else:
            raw = path.read_bytes()
    except (OSError, EOFError, zlib.error) as err:
        raise DatasetError(f"{path}: cannot read it ({err})") from None
    expected_magic = (UBYTE << 8) | dimensions
    header = 4 + 4 * dimensions
    if len(raw) < header:
        raise DatasetError(f"{path}: {len(raw)} bytes, shorter than an IDX header "
                           f"({header} bytes; truncated or not an IDX file)")
    (magic,) = struct.unpack(">I", raw[:4])
    if magic != expected_magic:
        raise DatasetError(f"{path}: magic number 0x{magic:08x}, expected 0x{expected_magic:08x} "
                           f"(IDX, unsigned bytes, {dimensions} dimension"
                           f"{'s' if dimensions > 1 else ''})")
    shape = struct.unpack(f">{dimensions}I", raw[4:header])
    size = header + int(np.prod(shape, dtype=np.int64))
    if len(raw) != size:
        raise DatasetError(f"{path}: {len(raw)} bytes where its IDX header {list(shape)} needs "
                           f"{size} ({'truncated' if len(raw) < size else 'trailing bytes'})")
    return np.frombuffer(raw, np.uint8, offset=header).reshape(shape)


def _pair(spec: registry.Spec, root: Path, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    images_path = registry.resolve(spec, f"{prefix}-images-idx3-ubyte.gz", root)
    labels_path = registry.resolve(spec, f"{prefix}-labels-idx1-ubyte.gz", root)
    images, labels = read(images_path, 3), read(labels_path, 1)
    if len(images) != len(labels):
        raise DatasetError(f"{labels_path}: {len(labels)} labels for the {len(images)} images "
                           f"of {images_path.name}")
    if labels.size and labels.max() >= 10:
        raise DatasetError(f"{labels_path}: label {int(labels.max())} outside 0..9")
    return images[:, None, :, :], labels.astype(np.int64)


def load(name: str, root: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`name` ("mnist" or "fashion-mnist") from a data directory, every file checked against its
    published digest first: (train images uint8 [N,1,28,28], train labels int64, test images,
    test labels)."""
    spec = registry.spec(name)
    x_train, y_train = _pair(spec, Path(root), "train")
    x_test, y_test = _pair(spec, Path(root), "t10k")
    return x_train, y_train, x_test, y_test
