"""Seeded permutations that are the same on every machine, Python and NumPy version: the stable
argsort of SplitMix64 outputs whose start is a BLAKE2b hash of the key.

NumPy's `Generator` streams may change between NumPy releases (NEP 19); a benchmark's splits and
data order must not, so that runs on different installations and frameworks see the same data.

    permutation(10, "epoch", seed, 3)   # the order of epoch 3
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def start(*key: int | str) -> np.uint64:
    """The 64-bit stream start for a key of integers and strings."""
    text = json.dumps(list(key), separators=(",", ":")).encode()
    return np.uint64(int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little"))


def splitmix64(base: np.uint64, n: int) -> np.ndarray:
    """The first n outputs of SplitMix64 started at `base` (uint64 arithmetic wraps)."""
    z = base + np.arange(1, n + 1, dtype=np.uint64) * _GAMMA
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def permutation(n: int, *key: int | str) -> np.ndarray:
    """A permutation of range(n) (int64) fixed by `key` alone."""
    return np.argsort(splitmix64(start(*key), n), kind="stable")
