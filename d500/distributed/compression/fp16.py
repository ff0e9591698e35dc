"""fp16 compression (Horovod's and torch DDP's fp16 hook): cast to half precision, allreduce, cast
back. Summable; 2 bytes per element."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from d500.distributed.compression.base import Compressor, as_float32


class FP16(Compressor):
    """Half-precision payload: n * 2 bytes. Values round to fp16 (relative error <= 2**-11 for
    normal numbers; |x| < 2**-14 loses precision, |x| > 65504 overflows to inf). The sum over ranks
    is taken in fp16 by MPI, so |sum of a coordinate over ranks| must stay below 65504."""

    name = "fp16"
    summable = True

    def compress(self, array: np.ndarray, name: str) -> tuple[list[np.ndarray], Any]:
        return [as_float32(array, name).astype(np.float16)], (array.shape, array.dtype)

    def decompress(self, payloads: Sequence[np.ndarray], ctx: Any) -> np.ndarray:
        shape, dtype = ctx
        return payloads[0].reshape(shape).astype(dtype)
