"""Distributed optimizers (schemes) over MPI, one module each, wrapping a level-2 Trainer; the
interface, `SCHEMES` and `make` are in base.py."""

from __future__ import annotations

from d500.distributed.schemes import (  # noqa: F401  (each registers itself)
    async_ps,
    dpsgd,
    local_sgd,
    ps,
    ssp,
    sync,
)
from d500.distributed.schemes.base import SCHEMES, Option, Parameters, Scheme, make, make_reducer

__all__ = ["SCHEMES", "Option", "Parameters", "Scheme", "make", "make_reducer"]
