"""Tensor fusion (Horovod, torch DDP): many small arrays packed into flat buckets of at most
`bucket_bytes`, one collective per bucket, results written back into the arrays in place.

    buckets = Buckets(grads)                   # layout from the first step's arrays, kept
    buckets.allreduce(grads, comm, op="average")   # every later step: pack, reduce, unpack

`grads` is a dict name -> array (or a list); NumPy arrays or torch CPU tensors (param.grad: the
results land in it, through a zero-copy view). Arrays are laid out in the order given, one dtype
per bucket; an array larger than `bucket_bytes` gets a bucket of its own. A bucket holding a single
contiguous array is that array's own memory (nothing copied); the others are flat buffers
allocated once. `pack`/`unpack` are public for schemes that do more than an allreduce per bucket
(compression: compress each packed buffer, exchange, decompress into it, unpack).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from d500.distributed.comm import Buffer, CommError, Communicator, Op, as_array

DEFAULT_BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket_cap_mb
Arrays = Mapping[str, Buffer] | Sequence[Buffer]


@dataclasses.dataclass(frozen=True)
class Slot:
    """One array's place in a bucket: its key, element offset, element count and shape."""

    key: Any
    offset: int
    size: int
    shape: tuple[int, ...]


@dataclasses.dataclass
class Bucket:
    """Arrays of one dtype reduced together."""

    dtype: np.dtype
    slots: list[Slot]
    size: int = 0  # elements
    buffer: np.ndarray | None = None  # allocated once, unless the bucket holds a single array

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize


class Buckets:
    """The fixed bucket layout of a set of arrays (keys, shapes and dtypes of the first call)."""

    def __init__(self, arrays: Arrays, bucket_bytes: int = DEFAULT_BUCKET_BYTES):
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) \
                or bucket_bytes < 1:
            raise CommError(f"bucket_bytes must be a positive whole number of bytes, got "
                            f"{bucket_bytes!r}")
        self.bucket_bytes = bucket_bytes
        self.buckets: list[Bucket] = []
        open_: dict[np.dtype, Bucket] = {}
        for key, a in _items(arrays):
            b = open_.get(a.dtype)
            if b is None or (b.size + a.size) * a.dtype.itemsize > bucket_bytes:
                b = open_[a.dtype] = Bucket(a.dtype, [])
                self.buckets.append(b)
            b.slots.append(Slot(key, b.size, a.size, a.shape))
            b.size += a.size
        for b in self.buckets:
            if len(b.slots) > 1:
                b.buffer = np.empty(b.size, dtype=b.dtype)
        self._packed: list[np.ndarray] = []
        self._views: list[bool] = []  # whether each packed buffer is the array's own memory

    def __len__(self) -> int:
        return len(self.buckets)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)

    def pack(self, arrays: Arrays) -> list[np.ndarray]:
        """One flat array per bucket holding these arrays' values (a single contiguous array's
        bucket is a view of it). The arrays must match the layout."""
        current = self._check(arrays)
        self._packed, self._views = [], []
        for b in self.buckets:
            if len(b.slots) == 1 and current[b.slots[0].key].flags.c_contiguous:
                self._packed.append(current[b.slots[0].key].reshape(-1))
                self._views.append(True)
                continue
            if b.buffer is None:
                b.buffer = np.empty(b.size, dtype=b.dtype)
            for s in b.slots:
                b.buffer[s.offset:s.offset + s.size] = current[s.key].reshape(-1)
            self._packed.append(b.buffer)
            self._views.append(False)
        return self._packed

    def unpack(self, arrays: Arrays) -> None:
        """Write the packed buffers (as changed since `pack`) back into these arrays."""
        if not self._packed:
            raise CommError("Buckets.unpack before pack")
        current = self._check(arrays)
        for b, buf, view in zip(self.buckets, self._packed, self._views):
            if view:
                continue
            for s in b.slots:
                current[s.key][...] = buf[s.offset:s.offset + s.size].reshape(s.shape)

    def apply(self, arrays: Arrays, fn: Callable[[np.ndarray], object]) -> Arrays:
        """pack, `fn(buffer)` on each bucket (in place), unpack; returns `arrays`."""
        for buf in self.pack(arrays):
            fn(buf)
        self.unpack(arrays)
        return arrays

    def allreduce(self, arrays: Arrays, comm: Communicator, op: Op = "average",
                  ring: bool = False) -> Arrays:
        """Sum or average every array over the ranks, one collective per bucket (MPI's
        Allreduce, or d500's ring with ring=True); results land in the arrays."""
        reduce = comm.ring_allreduce if ring else comm.allreduce
        return self.apply(arrays, lambda buf: reduce(buf, op))

    def _check(self, arrays: Arrays) -> dict[Any, np.ndarray]:
        current = dict(_items(arrays))
        expected = [s for b in self.buckets for s in b.slots]
        if len(current) != len(expected):
            raise CommError(f"the bucket layout holds {len(expected)} arrays, got "
                            f"{len(current)}")
        for b in self.buckets:
            for s in b.slots:
                a = current.get(s.key)
                if a is None:
                    raise CommError(f"the bucket layout has no array {s.key!r} this time")
                if a.dtype != b.dtype or a.shape != s.shape:
                    raise CommError(f"array {s.key!r} is {a.dtype} {a.shape}, the bucket layout "
                                    f"has {b.dtype} {s.shape}")
        return current


def _items(arrays: Arrays) -> list[tuple[Any, np.ndarray]]:
    pairs = arrays.items() if isinstance(arrays, Mapping) else enumerate(arrays)
    out = []
    for key, x in pairs:
        a = as_array(x)
        if not a.flags.writeable:
            raise CommError(f"array {key!r} is read-only; buckets write results back in place")
        out.append((key, a))
    return out
