"""The compressed exchange of one step's gradients through two collectives supplied by the caller
(the Communicator's allreduce and allgather, or local.py's simulated ranks), with its byte counts.

    reducer = CompressedReducer(TopK(0.01), allreduce=comm.allreduce, allgather=comm.allgather,
                                world=comm.size)
    averaged, step = reducer.reduce(grads)  # name -> float32 array, same order on every rank
    step.sent, step.dense, step.ratio       # this rank's payload bytes against dense float32

Per step: every array is compensated by the memory (error feedback), compressed, and the memory
keeps what its decompressed payload missed; then all payloads travel in ONE fused buffer: a
summable compressor's payloads are summed by one allreduce per payload dtype, and decompressed
once; other payloads are packed into one byte buffer, allgathered, and every rank's payloads are
decompressed and summed. A multi-round compressor (PowerSGD) runs its own `reduce`. The result is
the average over ranks (or the sum, average=False).

`sent` counts payload bytes (values, indices, scales, norms): what this rank contributes per step,
GRACE's data volume. What crosses the wire depends on the collective (a ring allreduce of B bytes
sends 2(N-1)/N * B per rank, an allgather of B bytes per rank receives (N-1) * B); the
Communicator counts those.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from d500.distributed.compression.base import Compressor, Memory, ResidualMemory, as_float32
from d500.errors import D500Error

Allreduce = Callable[[np.ndarray], "np.ndarray | None"]  # sums over ranks, in place or returned
Allgather = Callable[[np.ndarray], "Sequence[np.ndarray] | np.ndarray"]  # one array per rank


@dataclass
class StepBytes:
    """One step's volume on one rank: payload bytes sent, the dense float32 bytes of the same
    gradients, and the payload bytes per array."""

    sent: int
    dense: int
    per_array: dict[str, int] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """Compression ratio: dense bytes / sent bytes (> 1 means fewer bytes)."""
        return self.dense / self.sent if self.sent else math.inf


class CompressedReducer:
    """Averages gradients over `world` ranks with a compressor and an error-feedback memory.
    `memory=None` gives the compressor's default: ResidualMemory if `compressor.error_feedback`
    (top-k, random-k, EF-signSGD, PowerSGD), else none; pass Memory() to switch feedback off."""

    def __init__(self, compressor: Compressor, memory: Memory | None = None, *,
                 allreduce: Allreduce, allgather: Allgather, world: int,
                 average: bool = True) -> None:
        self.compressor = compressor
        self.memory = memory if memory is not None else default_memory(compressor)
        self.allreduce, self.allgather = allreduce, allgather
        self.world, self.average = world, average
        self.steps = 0
        self.sent_bytes = 0  # totals over all steps
        self.dense_bytes = 0

    def reduce(self, arrays: Mapping[str, np.ndarray], *, inplace: bool = False
               ) -> tuple[dict[str, np.ndarray], StepBytes]:
        """One step's exchange: (averaged gradients by name, this step's bytes). With `inplace`
        the results are written into the given arrays (e.g. torch .grad views) and returned."""
        if self.compressor.rounds > 1:
            out, per = self.compressor.reduce(arrays, self.allreduce, self.memory, self.world,
                                              self.average)
        else:
            out, per = self._one_round(arrays)
        for name, a in arrays.items():
            result = out[name].astype(a.dtype, copy=False).reshape(a.shape)
            if inplace and a.flags.writeable:
                np.copyto(a, result)
                result = a
            out[name] = result
        step = StepBytes(sum(per.values()), sum(int(a.size) * 4 for a in arrays.values()), per)
        self.steps += 1
        self.sent_bytes += step.sent
        self.dense_bytes += step.dense
        return out, step

    def _one_round(self, arrays: Mapping[str, np.ndarray]
                   ) -> tuple[dict[str, np.ndarray], dict[str, int]]:
        c, memory = self.compressor, self.memory
        sent: dict[str, tuple[list[np.ndarray], Any]] = {}
        for name, a in arrays.items():
            compensated = memory.compensate(as_float32(a, name), name)
            payloads, ctx = c.compress(compensated, name)
            memory.update(name, compensated, c.decompress(payloads, ctx))
            sent[name] = (payloads, ctx)
        per = {name: c.bytes(payloads) for name, (payloads, _) in sent.items()}
        scale = np.float32(1.0 / self.world) if self.average else np.float32(1.0)
        out: dict[str, np.ndarray] = {}
        if c.summable:
            summed = _allreduce_by_dtype([p for payloads, _ in sent.values() for p in payloads],
                                         self.allreduce)
            for name, (payloads, ctx) in sent.items():
                mine, summed = summed[:len(payloads)], summed[len(payloads):]
                out[name] = np.asarray(c.decompress(mine, ctx), dtype=np.float32) * scale
        else:
            gathered = _allgather_packed([payloads for payloads, _ in sent.values()],
                                         self.allgather, self.world)
            for i, (name, (_, ctx)) in enumerate(sent.items()):
                total = c.decompress_sum([rank[i] for rank in gathered], ctx)
                out[name] = np.asarray(total, dtype=np.float32) * scale
        return out, per


def compressed_allreduce(comm_allreduce: Allreduce, comm_allgather: Allgather,
                         compressor: Compressor, memory: Memory | None,
                         arrays: Mapping[str, np.ndarray], world: int, average: bool = True
                         ) -> tuple[dict[str, np.ndarray], StepBytes]:
    """One step without keeping a reducer: the compressor and the memory carry the state between
    steps (memory=None: no error feedback, since a fresh residual would be dropped anyway)."""
    reducer = CompressedReducer(compressor, memory if memory is not None else Memory(),
                                allreduce=comm_allreduce, allgather=comm_allgather, world=world,
                                average=average)
    return reducer.reduce(arrays)


def default_memory(compressor: Compressor) -> Memory:
    """Error feedback for compressors that need it, none for the others."""
    return ResidualMemory() if compressor.error_feedback else Memory()


def _allreduce_by_dtype(payloads: list[np.ndarray], allreduce: Allreduce) -> list[np.ndarray]:
    """Sum payloads over ranks with one allreduce per dtype; the sums in the payloads' order."""
    out: list[np.ndarray | None] = [None] * len(payloads)
    for dtype in dict.fromkeys(p.dtype for p in payloads):
        which = [i for i, p in enumerate(payloads) if p.dtype == dtype]
        buffer = np.concatenate([payloads[i].reshape(-1) for i in which])
        result = allreduce(buffer)
        summed = buffer if result is None else np.asarray(result)
        offset = 0
        for i in which:
            out[i] = summed[offset:offset + payloads[i].size].reshape(payloads[i].shape)
            offset += payloads[i].size
    return out  # type: ignore[return-value]


def _allgather_packed(payloads: list[list[np.ndarray]], allgather: Allgather, world: int
                      ) -> list[list[list[np.ndarray]]]:
    """Allgather every array's payloads as one byte buffer; gathered[rank][array] = payloads.
    Payloads are laid out widest dtype first, so each one starts aligned to its item size."""
    items = [(i, j, p) for i, ps in enumerate(payloads) for j, p in enumerate(ps)]
    items.sort(key=lambda item: -item[2].itemsize)  # stable: same layout on every rank
    layout, offset = [], 0
    for i, j, p in items:
        layout.append((i, j, offset, p.nbytes, p.dtype, p.shape))
        offset += p.nbytes
    buffer = np.empty(offset, dtype=np.uint8)
    for (_, _, start, nbytes, _, _), (_, _, p) in zip(layout, items, strict=True):
        buffer[start:start + nbytes] = np.ascontiguousarray(p).reshape(-1).view(np.uint8)
    received = allgather(buffer)
    if len(received) != world:
        raise D500Error(f"compressed allgather returned {len(received)} buffers for {world} ranks")
    gathered: list[list[list[np.ndarray]]] = []
    for rank in received:
        data = np.asarray(rank, dtype=np.uint8).reshape(-1)
        if data.size != offset:
            raise D500Error(f"compressed allgather: a rank sent {data.size} bytes, this rank "
                            f"{offset}; the ranks' gradients differ in names or shapes")
        mine: list[list[Any]] = [[None] * len(ps) for ps in payloads]
        for i, j, start, nbytes, dtype, shape in layout:
            mine[i][j] = data[start:start + nbytes].view(dtype).reshape(shape)
        gathered.append(mine)
    return gathered
