"""EF-signSGD (Karimireddy et al. 2019, "Error feedback fixes SignSGD"): one sign bit per
coordinate, scaled by the mean magnitude, with error feedback."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from d500.distributed.compression.base import Compressor, as_float32


class EFSignSGD(Compressor):
    """The scaled sign: p -> (||p||_1 / n) * sign(p), with sign(0) sent as +1. Payloads: the sign
    bits packed eight to a byte (np.packbits; bit 1 = negative), uint8[ceil(n / 8)], and the scale
    float32[1]: ceil(n / 8) + 4 bytes. The scale differs per rank: allgathered. Error feedback
    keeps p - (||p||_1 / n) sign(p) for the next step (the paper's e_{t+1})."""

    name = "efsignsgd"
    error_feedback = True

    def compress(self, array: np.ndarray, name: str) -> tuple[list[np.ndarray], Any]:
        flat = as_float32(array, name).reshape(-1)
        scale = np.array([np.abs(flat).mean(dtype=np.float64) if flat.size else 0.0],
                         dtype=np.float32)
        return [np.packbits(flat < 0), scale], (array.shape, array.dtype)

    def decompress(self, payloads: Sequence[np.ndarray], ctx: Any) -> np.ndarray:
        bits, scale = payloads
        shape, dtype = ctx
        n = int(np.prod(shape))
        negative = np.unpackbits(bits, count=n).astype(np.float32)
        signed = (1.0 - 2.0 * negative) * scale[0]
        return signed.astype(np.float32, copy=False).reshape(shape).astype(dtype, copy=False)
