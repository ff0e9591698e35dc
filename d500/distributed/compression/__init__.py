"""Gradient compression in the GRACE shape: compressors (none, fp16, topk, randomk, qsgd,
efsignsgd, powersgd), error-feedback memory, and the compressed exchange of a step's gradients.

    compressor, memory = make("topk", {"density": 0.01}, seed=seed, worker=rank)
    reducer = CompressedReducer(compressor, memory, allreduce=..., allgather=..., world=N)

Bytes per rank per array of n float32 elements (payloads only; see reducer.py for the wire):
    none       4n                       allreduce
    fp16       2n                       allreduce
    topk       8k, k = ceil(d n)        allgather (values float32 + indices int32)
    randomk    4k, k = ceil(d n)        allreduce (shared-seed indices are not sent)
    qsgd       n + 4 ceil(n / bucket)   allgather (int8 codes + a float32 norm per bucket)
    efsignsgd  ceil(n / 8) + 4          allgather (packed sign bits + a float32 scale)
    powersgd   4 (a + b) r per a x b matrix, 4n per array sent dense   two allreduces
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from d500.distributed.compression.base import (
    Compressor,
    Memory,
    NoneCompressor,
    ResidualMemory,
)
from d500.distributed.compression.fp16 import FP16
from d500.distributed.compression.powersgd import PowerSGD
from d500.distributed.compression.qsgd import QSGD
from d500.distributed.compression.reducer import (
    CompressedReducer,
    StepBytes,
    compressed_allreduce,
    default_memory,
)
from d500.distributed.compression.signsgd import EFSignSGD
from d500.distributed.compression.sparse import RandomK, TopK
from d500.errors import ConfigError, UsageError, listed

COMPRESSORS: dict[str, type[Compressor]] = {
    c.name: c for c in (NoneCompressor, FP16, TopK, RandomK, QSGD, EFSignSGD, PowerSGD)}


def make(name: str, params: Mapping[str, Any] | None = None, *, seed: int = 0, worker: int = 0,
         where: str = "compression") -> tuple[Compressor, Memory]:
    """A compressor by name with its hyperparameters, and its memory. `params` may also hold
    `error_feedback: true|false` (default: the compressor's own). `seed` must be the same on
    every rank (random-k indices, PowerSGD's first Q); `worker` is this rank (QSGD's rounding).
    Errors name `where` (e.g. "submission.yaml: compression") and the field."""
    if name not in COMPRESSORS:
        raise UsageError(f"{where}: unknown compressor '{name}' "
                         f"(known: {listed(name, sorted(COMPRESSORS))})")
    cls = COMPRESSORS[name]
    params = dict(params or {})
    feedback = params.pop("error_feedback", cls.error_feedback)
    if not isinstance(feedback, bool):
        raise ConfigError(f"{where}: error_feedback must be true or false, got {feedback!r}")
    accepted = inspect.signature(cls.__init__).parameters
    unknown = sorted(set(params) - set(accepted) - {"self"})
    if unknown or "worker" in params:
        allowed = sorted({*accepted, "error_feedback"} - {"self", "worker"})
        raise ConfigError(f"{where}: compressor '{name}' has no parameter "
                          f"'{(unknown or ['worker'])[0]}' (it takes: {', '.join(allowed)})")
    if "seed" in accepted:
        params.setdefault("seed", seed)
    if "worker" in accepted:
        params["worker"] = worker
    try:
        compressor = cls(**params)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None
    return compressor, ResidualMemory() if feedback else Memory()


__all__ = [
    "COMPRESSORS",
    "FP16",
    "QSGD",
    "CompressedReducer",
    "Compressor",
    "EFSignSGD",
    "Memory",
    "NoneCompressor",
    "PowerSGD",
    "RandomK",
    "ResidualMemory",
    "StepBytes",
    "TopK",
    "compressed_allreduce",
    "default_memory",
    "make",
]
