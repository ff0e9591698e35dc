"""The ranks as a grid of parallel dimensions (data x pipeline x tensor == the world size), with one
Communicator per dimension over the ranks that differ only in that dimension's coordinate.

    grid = Grid(comm, {"data": 2, "pipeline": 1, "tensor": 1})
    grid.data.allreduce(grads, op="average")     # among the ranks of my data group
    grid.coords                                  # {"data": d, "pipeline": p, "tensor": t}

Ranks are laid out as Megatron-LM lays them: tensor fastest, then data, then pipeline, so
rank = (p * data + d) * tensor + t, and a tensor group is consecutive ranks (one host's, where
hosts hold consecutive ranks). A dimension of the whole world is `comm` itself (its traffic is the
run's, as before dimensions); a dimension of one rank is a one-rank Communicator (no MPI); any
other is an MPI_Comm_split of `comm`, whose bytes are counted by its own Communicator.
"""

from __future__ import annotations

from typing import Any

from d500.distributed.comm import Communicator
from d500.errors import UsageError

ORDER = ("pipeline", "data", "tensor")  # slowest to fastest varying in the rank number


class Grid:
    """This rank's coordinates and a Communicator per dimension (see the module docstring)."""

    def __init__(self, comm: Communicator, dims: dict[str, int]):
        sizes = [dims.get(k, 1) for k in ORDER]
        total = sizes[0] * sizes[1] * sizes[2]
        if total != comm.size:
            raise UsageError(f"the dimensions data x pipeline x tensor = {dims.get('data', 1)} x "
                             f"{dims.get('pipeline', 1)} x {dims.get('tensor', 1)} do not "
                             f"multiply to the world size {comm.size}")
        self.world, self.sizes = comm, dict(zip(ORDER, sizes))
        self.coords = coordinates(comm.rank, self.sizes)
        self._comms = {k: self._split(k) for k in ORDER}

    def _split(self, key: str) -> Communicator:
        """The Communicator of the ranks sharing every coordinate but `key`'s."""
        if self.sizes[key] == self.world.size:
            return self.world
        if self.sizes[key] == 1:
            return Communicator.single()
        colour = sum(self.coords[k] * _stride(self.sizes, k) for k in ORDER if k != key)
        return Communicator(self.world.mpi.Split(colour, self.coords[key]))

    def __getattr__(self, key: str) -> Any:
        if key in ORDER:
            return self.__dict__["_comms"][key]
        raise AttributeError(key)

    def free(self) -> None:
        """Free the split communicators (those that are neither the world nor one rank)."""
        for c in self._comms.values():
            if c is not self.world and c.mpi is not None:
                c.mpi.Free()


def coordinates(rank: int, sizes: dict[str, int]) -> dict[str, int]:
    """Rank `rank`'s coordinate in each dimension of `sizes` (the layout of the module
    docstring)."""
    rest, coords = rank, {}
    for key in reversed(ORDER):
        rest, coords[key] = divmod(rest, sizes.get(key, 1))
    return {k: coords[k] for k in ORDER}


def _stride(sizes: dict[str, int], key: str) -> int:
    """The step in rank number of one unit of coordinate `key`."""
    out = 1
    for k in reversed(ORDER):
        if k == key:
            return out
        out *= sizes[k]
    raise KeyError(key)
