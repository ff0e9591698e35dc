"""PowerSGD (Vogels, Karimireddy, Jaggi 2019): a rank-r approximation of every gradient matrix by
one step of power iteration, warm-started from the previous step's Q, with error feedback; P and
Q are allreduced, so its exchange is a two-round protocol (`reduce`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from d500.distributed.compression.base import (
    Compressor,
    Memory,
    as_float32,
    check_number,
    seed_key,
)

Allreduce = Callable[[np.ndarray], "np.ndarray | None"]


def orthogonalize(p: np.ndarray) -> np.ndarray:
    """Orthonormal columns spanning p's columns (reduced QR, Householder: no NaN on a zero p)."""
    return np.linalg.qr(p, mode="reduced")[0].astype(np.float32, copy=False)


class PowerSGD(Compressor):
    """Rank-`rank` PowerSGD. An array of shape (n, ...) is the matrix M of shape n x m, m the
    product of the other dimensions; with r = min(rank, n, m) it is compressed only if
    (n + m) * r < n * m, else (1-D arrays, biases, small matrices) it is sent dense. Per matrix
    and step:

        P = M Q            (Q: m x r, from the previous step; at step 0 drawn from `seed`)
        P = allreduce(P);  P = orthogonalize(P)
        Q = M^T P;         Q = allreduce(Q) / world          (kept: the warm start of next step)
        M ~ P Q^T          (the average over ranks of P P^T M_rank)

    Bytes per rank and step: (n + m) * r * 4 per compressed matrix, n * m * 4 per dense array.
    Error feedback keeps M - P Q^T on each rank, as in the authors' code. Q is the same on every
    rank (a shared seed, then allreduced values), so ranks must pass the same `seed`.

    `reduce(arrays, allreduce, memory, world)` runs the whole exchange with two fused allreduces
    (round 1: every P and every dense array in one float32 buffer; round 2: every Q).
    `compress`/`decompress` are the one-rank round trip (payloads [P, Q] or [dense]); a P and Q
    computed on different ranks do not sum to anything meaningful, so never exchange those."""

    name = "powersgd"
    summable = True
    rounds = 2
    error_feedback = True
    kept = "_q"  # each matrix's Q, the next step's warm start

    def __init__(self, rank: int = 2, seed: int = 0) -> None:
        self.rank = check_number(self.name, "rank", rank, 1, 2**31 - 1, integer=True)
        self.seed = check_number(self.name, "seed", seed, 0, 2**63, integer=True)
        self._q: dict[str, np.ndarray] = {}

    def matrix(self, shape: tuple[int, ...]) -> tuple[int, int, int] | None:
        """(n, m, r) if an array of this shape is compressed, None if it is sent dense."""
        if len(shape) < 2:
            return None
        n, m = shape[0], math.prod(shape[1:])
        r = min(self.rank, n, m)
        return (n, m, r) if (n + m) * r < n * m else None

    def _warm(self, name: str, m: int, r: int) -> np.ndarray:
        q = self._q.get(name)
        if q is None or q.shape != (m, r):
            q = seed_key(self.seed, name, 0).standard_normal((m, r)).astype(np.float32)
        return q

    def compress(self, array: np.ndarray, name: str) -> tuple[list[np.ndarray], Any]:
        flat = as_float32(array, name)
        shape = self.matrix(array.shape)
        if shape is None:
            return [flat.reshape(-1)], (array.shape, array.dtype)
        n, m, r = shape
        mat = flat.reshape(n, m)
        p = orthogonalize(mat @ self._warm(name, m, r))
        q = mat.T @ p
        self._q[name] = q
        return [p, q], (array.shape, array.dtype)

    def decompress(self, payloads: Sequence[np.ndarray], ctx: Any) -> np.ndarray:
        shape, dtype = ctx
        out = payloads[0] if len(payloads) == 1 else payloads[0] @ payloads[1].T
        return out.reshape(shape).astype(dtype, copy=False)

    def reduce(self, arrays: Mapping[str, np.ndarray], allreduce: Allreduce, memory: Memory,
               world: int, average: bool = True
               ) -> tuple[dict[str, np.ndarray], dict[str, int]]:
        """The two-round exchange of all arrays: returns (the averaged (or, average=False, summed)
        decompressed gradients by name, float32 in the input shapes; bytes this rank sent by name).
        `allreduce(buffer)` sums a flat float32 buffer over all ranks, in place or returning the
        result; every rank must call `reduce` with the same names, shapes and order."""
        comp = {name: memory.compensate(as_float32(a, name), name) for name, a in arrays.items()}
        plans = {name: self.matrix(a.shape) for name, a in arrays.items()}
        mats = {name: comp[name].reshape(plan[0], plan[1])
                for name, plan in plans.items() if plan is not None}
        dense = [name for name, plan in plans.items() if plan is None]

        # Round 1: every P = M Q and every dense array, in one buffer.
        ps = {name: mat @ self._warm(name, mat.shape[1], plans[name][2])
              for name, mat in mats.items()}
        parts = _fused_allreduce([*ps.values(), *(comp[name] for name in dense)], allreduce)
        out: dict[str, np.ndarray] = {}
        for name, summed in zip([*ps, *dense], parts, strict=True):
            if name in ps:
                ps[name] = orthogonalize(summed)
            else:
                out[name] = summed.reshape(arrays[name].shape) / np.float32(world)

        # Round 2: every Q = M^T P, in one buffer; kept averaged as the next step's warm start.
        qs = _fused_allreduce([mats[name].T @ p for name, p in ps.items()], allreduce)
        for (name, p), q in zip(ps.items(), qs, strict=True):
            self._q[name] = q / np.float32(world)
            out[name] = (p @ self._q[name].T).reshape(arrays[name].shape)

        sent: dict[str, int] = {}
        for name in arrays:  # error feedback on matrices; a dense array loses nothing
            plan = plans[name]
            memory.update(name, comp[name], out[name] if plan is not None else comp[name])
            sent[name] = ((plan[0] + plan[1]) * plan[2] * 4 if plan is not None
                          else int(np.prod(arrays[name].shape)) * 4)
            if not average:
                out[name] = out[name] * np.float32(world)
        return out, sent


def _fused_allreduce(parts: Sequence[np.ndarray], allreduce: Allreduce) -> list[np.ndarray]:
    """Allreduce several float32 arrays as one flat buffer; the summed pieces in their shapes."""
    if not parts:
        return []
    buffer = np.concatenate([np.asarray(p, dtype=np.float32).reshape(-1) for p in parts])
    result = allreduce(buffer)
    summed = buffer if result is None else np.asarray(result)
    pieces, offset = [], 0
    for p in parts:
        pieces.append(summed[offset:offset + p.size].reshape(p.shape))
        offset += p.size
    return pieces
