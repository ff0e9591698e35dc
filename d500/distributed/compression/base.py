"""The GRACE-shaped contracts of gradient compression: a Compressor (array -> payload arrays + ctx
and back), a Memory (error feedback), and the dense NoneCompressor the others are measured against.

    payloads, ctx = compressor.compress(compensated, name)   # on every rank
    compressor.bytes(payloads)                                # what this rank puts on the wire
    memory.update(name, compensated, compressor.decompress(payloads, ctx))

Rules every compressor keeps, so the reducer (reducer.py) can exchange any of them:
- `ctx` holds only what is the same on every rank (shape, dtype, indices drawn from a shared seed);
  everything rank-specific (values, indices chosen from local data, norms, scales) is a payload, so
  a rank can decompress another rank's payloads with its own ctx;
- `summable`: the payloads of all ranks may be summed elementwise (one allreduce) and decompressed
  once (fp16, random-k with shared indices, dense). Otherwise (top-k, sign, QSGD) every rank's
  payloads are allgathered and each is decompressed, then the results are summed;
- payload byte counts depend only on the array's shape, never on its values, so every rank's
  payloads have the same sizes and one fixed-size Allgather carries them.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from d500.errors import ConfigError


class Compressor:
    """Compress one gradient array into payload arrays, and back (subclass it; see the module)."""

    name: ClassVar[str] = ""
    summable: ClassVar[bool] = False  # payloads may be allreduced instead of allgathered
    rounds: ClassVar[int] = 1  # >1: the exchange needs several collectives; see PowerSGD.reduce
    error_feedback: ClassVar[bool] = False  # the memory `make` gives it by default
    kept: ClassVar[str] = ""  # the attribute holding its state between steps, by array name

    def saved(self) -> dict[str, np.ndarray]:
        """Its state between steps by array name (a step counter, a warm start), for a
        checkpoint (d500.distributed.resuming)."""
        return {k: np.asarray(v) for k, v in getattr(self, self.kept, {}).items()} \
            if self.kept else {}

    def restored(self, arrays: dict[str, np.ndarray]) -> None:
        """Put back what `saved` returned."""
        if self.kept:
            setattr(self, self.kept, {k: int(v) if v.ndim == 0 else np.array(v)
                                      for k, v in arrays.items()})

    def compress(self, array: np.ndarray, name: str) -> tuple[list[np.ndarray], Any]:
        raise NotImplementedError

    def decompress(self, payloads: Sequence[np.ndarray], ctx: Any) -> np.ndarray:
        raise NotImplementedError

    def decompress_sum(self, gathered: Sequence[Sequence[np.ndarray]], ctx: Any) -> np.ndarray:
        """The sum over ranks of decompressed payloads (the allgather path); override for speed."""
        total = self.decompress(gathered[0], ctx).astype(np.float32, copy=True)
        for payloads in gathered[1:]:
            total += self.decompress(payloads, ctx)
        return total

    def bytes(self, payloads: Sequence[np.ndarray]) -> int:
        """Bytes this rank sends for one array: every payload (values, indices, scales, norms)."""
        return int(sum(p.nbytes for p in payloads))

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({params})"


class Memory:
    """No error feedback: `compensate` returns the gradient, `update` forgets what was lost."""

    def compensate(self, array: np.ndarray, name: str) -> np.ndarray:
        return array

    def update(self, name: str, compensated: np.ndarray, sent: np.ndarray) -> None:
        """`sent` is the decompressed value of what was sent for `compensated`."""

    def residual(self, name: str) -> np.ndarray | None:
        return None

    def saved(self) -> dict[str, np.ndarray]:
        """What it keeps between steps by array name, for a checkpoint."""
        return {}

    def restored(self, arrays: dict[str, np.ndarray]) -> None:
        """Put back what `saved` returned."""


class ResidualMemory(Memory):
    """Error feedback (Seide et al. 2014; Karimireddy et al. 2019; GRACE's ResidualMemory): what a
    compressor did not send is kept per array and added to the next step's gradient, so nothing is
    lost, only delayed: sum of sent over steps = sum of gradients - the residual kept now."""

    def __init__(self) -> None:
        self._residuals: dict[str, np.ndarray] = {}

    def compensate(self, array: np.ndarray, name: str) -> np.ndarray:
        residual = self._residuals.get(name)
        if residual is None:
            return np.asarray(array, dtype=np.float32)
        return residual + array  # a new array: the caller's gradient is never modified

    def update(self, name: str, compensated: np.ndarray, sent: np.ndarray) -> None:
        self._residuals[name] = np.subtract(compensated, sent, dtype=np.float32)

    def residual(self, name: str) -> np.ndarray | None:
        return self._residuals.get(name)

    def saved(self) -> dict[str, np.ndarray]:
        return dict(self._residuals)

    def restored(self, arrays: dict[str, np.ndarray]) -> None:
        self._residuals = {k: np.array(v, np.float32) for k, v in arrays.items()}


class NoneCompressor(Compressor):
    """Dense: the float32 gradient itself, allreduced (the baseline of every ratio)."""

    name = "none"
    summable = True

    def compress(self, array: np.ndarray, name: str) -> tuple[list[np.ndarray], Any]:
        return [as_float32(array, name)], (array.shape, array.dtype)

    def decompress(self, payloads: Sequence[np.ndarray], ctx: Any) -> np.ndarray:
        shape, dtype = ctx
        return payloads[0].reshape(shape).astype(dtype, copy=False)


def as_float32(array: np.ndarray, name: str) -> np.ndarray:
    """The array as float32 (no copy when it already is); a non-float gradient is refused."""
    if not isinstance(array, np.ndarray) or array.dtype.kind != "f":
        what = getattr(array, "dtype", type(array).__name__)
        raise ConfigError(f"gradient '{name}': compression needs a float NumPy array, got {what}")
    return np.asarray(array, dtype=np.float32)


def seed_key(seed: int, name: str, step: int, *more: int) -> np.random.Generator:
    """A generator fixed by (seed, array name, step, ...): the same on every rank that passes the
    same values, independent of the order in which arrays are compressed."""
    return np.random.default_rng([seed, zlib.crc32(name.encode()), step, *more])


def check_number(compressor: str, field: str, value: Any, low: float, high: float,
                 *, integer: bool = False, low_open: bool = False) -> Any:
    """Validate one hyperparameter of a compressor; the error names the compressor and field."""
    kind = "an integer" if integer else "a number"
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    ok = ok and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and value <= high
    if not ok:
        lo = "(" if low_open else "["
        hi = "inf)" if math.isinf(high) else f"{high:g}]"
        raise ConfigError(f"compressor '{compressor}': {field} must be {kind} in {lo}{low:g}, "
                          f"{hi}, got {value!r}")
    return value
