"""N ranks simulated on threads in one process: the allreduce and allgather callables the reducer
takes, so compression can be run and tested at N ranks without MPI (the MPI tests use comm.py).

    group = LocalGroup(4)
    def rank_main(rank):
        reducer = CompressedReducer(TopK(0.01), allreduce=group.allreduce(rank),
                                    allgather=group.allgather(rank), world=group.world)
        return reducer.reduce(grads[rank])
    results = group.run(rank_main)          # one result per rank, in rank order

Sums are taken in rank order, so every rank gets the identical result, as from MPI's Allreduce.
`calls[rank]` lists (collective, bytes of the buffer this rank passed) for every call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from d500.errors import D500Error

T = TypeVar("T")


class LocalGroup:
    """`world` simulated ranks meeting at a barrier (a rank that fails releases the others)."""

    def __init__(self, world: int, timeout: float = 60.0) -> None:
        if world < 1:
            raise D500Error(f"LocalGroup: world must be >= 1, got {world}")
        self.world = world
        self._barrier = threading.Barrier(world, timeout=timeout)
        self._slots: list[Any] = [None] * world
        self.calls: list[list[tuple[str, int]]] = [[] for _ in range(world)]

    def _exchange(self, rank: int, value: np.ndarray) -> list[np.ndarray]:
        self._slots[rank] = value.copy()
        self._barrier.wait()
        everyone = list(self._slots)
        self._barrier.wait()  # nobody overwrites a slot before all have read
        return everyone

    def allreduce(self, rank: int) -> Callable[[np.ndarray], np.ndarray]:
        """Rank `rank`'s allreduce: sums the buffer over all ranks, in place, and returns it."""
        def allreduce(buffer: np.ndarray) -> np.ndarray:
            self.calls[rank].append(("allreduce", buffer.nbytes))
            everyone = self._exchange(rank, buffer)
            total = everyone[0].copy()
            for other in everyone[1:]:
                total += other
            buffer[...] = total
            return buffer
        return allreduce

    def allgather(self, rank: int) -> Callable[[np.ndarray], list[np.ndarray]]:
        """Rank `rank`'s allgather: every rank's buffer, in rank order."""
        def allgather(buffer: np.ndarray) -> list[np.ndarray]:
            self.calls[rank].append(("allgather", buffer.nbytes))
            return self._exchange(rank, buffer)
        return allgather

    def run(self, fn: Callable[[int], T]) -> list[T]:
        """fn(rank) on `world` threads; the results in rank order. The first failure is raised."""
        results: list[Any] = [None] * self.world
        errors: list[tuple[int, BaseException]] = []

        def main(rank: int) -> None:
            try:
                results[rank] = fn(rank)
            except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
                errors.append((rank, err))
                self._barrier.abort()

        threads = [threading.Thread(target=main, args=(r,), name=f"rank{r}")
                   for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            first = [e for e in errors if not isinstance(e[1], threading.BrokenBarrierError)]
            raise (first or errors)[0][1]
        return results
