"""QSGD (Alistarh et al. 2017): unbiased stochastic quantization of each coordinate to one of s
levels of the norm; here s = 127, one signed byte per coordinate and a float32 norm per bucket."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from d500.distributed.compression.base import Compressor, as_float32, check_number, seed_key


class QSGD(Compressor):
    """8-bit QSGD. The flattened array is cut into buckets of `bucket` coordinates (the paper's
    variance control; the last one may be short); for a bucket v with norm ||v||_2, coordinate v_i
    is sent as sign(v_i) * xi_i, where with l = floor(|v_i| / ||v|| * s) the level xi_i is l + 1
    with probability |v_i| / ||v|| * s - l and l otherwise, so E[||v|| / s * sign(v_i) xi_i] = v_i.
    Payloads: codes int8[n] and norms float32[ceil(n / bucket)]: n + 4 * ceil(n / bucket) bytes.
    Norms differ per rank: allgathered. The rounding is drawn from a generator keyed by (seed,
    worker, array name, step): pass each rank as `worker`, or the rounding noise of the
    ranks is correlated."""

    name = "qsgd"
    kept = "_steps"  # each array's step, which keys its random rounding

    def __init__(self, levels: int = 127, bucket: int = 512, seed: int = 0,
                 worker: int = 0) -> None:
        self.levels = check_number(self.name, "levels", levels, 1, 127, integer=True)
        self.bucket = check_number(self.name, "bucket", bucket, 1, 2**31 - 1, integer=True)
        self.seed = check_number(self.name, "seed", seed, 0, 2**63, integer=True)
        self.worker = check_number(self.name, "worker", worker, 0, 2**31 - 1, integer=True)
        self._steps: dict[str, int] = {}

    def _buckets(self, flat: np.ndarray) -> np.ndarray:
        rows = math.ceil(flat.size / self.bucket)
        padded = np.zeros(rows * self.bucket, dtype=np.float64)
        padded[:flat.size] = flat
        return padded.reshape(rows, self.bucket)

    def compress(self, array: np.ndarray, name: str) -> tuple[list[np.ndarray], Any]:
        flat = as_float32(array, name).reshape(-1)
        step = self._steps.get(name, 0)
        self._steps[name] = step + 1
        buckets = self._buckets(flat)
        norms = np.sqrt(np.einsum("ij,ij->i", buckets, buckets)).astype(np.float32)
        scale = np.divide(self.levels, norms.astype(np.float64), out=np.zeros(len(norms)),
                          where=norms > 0)
        level = np.abs(buckets) * scale[:, None]
        low = np.floor(level)
        u = seed_key(self.seed, name, step, self.worker).random(level.shape)
        xi = np.minimum(low + (u < level - low), self.levels)  # the min only trims float rounding
        codes = (np.sign(buckets) * xi).astype(np.int8).reshape(-1)[:flat.size]
        return [codes, norms], (array.shape, array.dtype)

    def decompress(self, payloads: Sequence[np.ndarray], ctx: Any) -> np.ndarray:
        codes, norms = payloads
        shape, dtype = ctx
        n = codes.size
        unit = np.repeat(norms / np.float32(self.levels), self.bucket)[:n]
        return (codes.astype(np.float32) * unit).reshape(shape).astype(dtype, copy=False)
