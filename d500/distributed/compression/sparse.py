"""Sparsifiers: top-k (the k largest magnitudes, values + int32 indices, allgathered) and random-k
(k coordinates drawn from a generator shared by all ranks, so only values travel and they sum)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from d500.distributed.compression.base import Compressor, as_float32, check_number, seed_key


def count(density: float, n: int) -> int:
    """k = ceil(density * n), at least 1 for a non-empty array (density in (0, 1])."""
    return min(n, max(1, math.ceil(density * n))) if n else 0


class TopK(Compressor):
    """Top-k sparsification (Aji & Heafield 2017; Lin et al. 2017 "Deep Gradient Compression"),
    with error feedback by default. Payloads: values float32[k] and indices int32[k] into the
    flattened array, so one array costs k * (4 + 4) bytes with k = ceil(density * n). Each rank
    chooses its own indices, so the payloads are allgathered (not summable)."""

    name = "topk"
    error_feedback = True

    def __init__(self, density: float = 0.01) -> None:
        self.density = check_number(self.name, "density", density, 0, 1, low_open=True)

    def compress(self, array: np.ndarray, name: str) -> tuple[list[np.ndarray], Any]:
        flat = as_float32(array, name).reshape(-1)
        k = count(self.density, flat.size)
        if k < flat.size:
            index = np.argpartition(np.abs(flat), flat.size - k)[flat.size - k:]
            index.sort()  # ascending: a cache-friendly gather and scatter
        else:
            index = np.arange(flat.size)
        index = index.astype(np.int32)
        return [flat[index], index], (array.shape, array.dtype)

    def decompress(self, payloads: Sequence[np.ndarray], ctx: Any) -> np.ndarray:
        values, index = payloads
        shape, dtype = ctx
        out = np.zeros(math.prod(shape), dtype=np.float32)
        out[index] = values
        return out.reshape(shape).astype(dtype, copy=False)

    def decompress_sum(self, gathered: Sequence[Sequence[np.ndarray]], ctx: Any) -> np.ndarray:
        shape, dtype = ctx
        out = np.zeros(math.prod(shape), dtype=np.float32)
        for values, index in gathered:  # indices are unique within one rank's payload
            out[index] += values
        return out.reshape(shape).astype(dtype, copy=False)


class RandomK(Compressor):
    """Random-k sparsification (Stich et al. 2018, "Sparsified SGD with memory"), error feedback
    by default. The k = ceil(density * n) indices come from a generator keyed by (seed, array name,
    step), identical on every rank given the same seed, so the indices are not sent and the value
    payloads of all ranks line up: summable, one allreduce. Payload: values float32[k], k * 4 bytes.
    Every rank must compress each array the same number of times (the step counts per name)."""

    name = "randomk"
    summable = True
    error_feedback = True
    kept = "_steps"  # each array's step, which keys its indices

    def __init__(self, density: float = 0.01, seed: int = 0) -> None:
        self.density = check_number(self.name, "density", density, 0, 1, low_open=True)
        self.seed = check_number(self.name, "seed", seed, 0, 2**63, integer=True)
        self._steps: dict[str, int] = {}

    def indices(self, name: str, n: int, step: int) -> np.ndarray:
        """The sorted int64 indices chosen for array `name` of n elements at `step` (from 0)."""
        k = count(self.density, n)
        index = seed_key(self.seed, name, step).choice(n, size=k, replace=False)
        index.sort()
        return index

    def compress(self, array: np.ndarray, name: str) -> tuple[list[np.ndarray], Any]:
        flat = as_float32(array, name).reshape(-1)
        step = self._steps.get(name, 0)
        self._steps[name] = step + 1
        index = self.indices(name, flat.size, step)
        return [flat[index]], (array.shape, array.dtype, index)

    def decompress(self, payloads: Sequence[np.ndarray], ctx: Any) -> np.ndarray:
        shape, dtype, index = ctx
        out = np.zeros(math.prod(shape), dtype=np.float32)
        out[index] = payloads[0]
        return out.reshape(shape).astype(dtype, copy=False)
