"""The level-3 communicator: collectives on mpi4py's buffer interface (never pickled), in place on
NumPy arrays and zero-copy views of torch CPU tensors, counting the bytes and seconds each costs.

    comm = Communicator.for_world()        # COMM_WORLD under mpiexec, else a 1-rank communicator
    comm.allreduce(grad, op="average")     # in place; MPI_Allreduce
    comm.ring_allreduce(grad)              # the same sum, Baidu's ring on Sendrecv
    comm.traffic["allreduce"].sent         # bytes this rank sent in allreduce calls
    comm.reset()

Byte counts are exact per rank and per collective name, and none is read from the network
interface. For d500's own algorithms (ring_allreduce, neighbour_exchange) they are the bytes
passed to Send/Recv. For MPI's collectives, whose algorithm MPI picks internally, they are the
bytes of the bandwidth-optimal algorithm named below, which is also what the alpha-beta model
charges (`ring_counts`, `chain_counts`, `gather_counts` give them without communicating):

- allreduce: the ring (reduce-scatter then allgather over N chunks laid out like
  `numpy.array_split`): rank r sends 2L - c[r+1] - c[r+2] and receives 2L - c[r] - c[r+1]
  elements (c: chunk lengths, indices mod N), i.e. 2(N-1)/N * B when N divides the length L and
  within 2 elements of it otherwise; summed over ranks, exactly 2(N-1) * B each way. d500's
  ring_allreduce counts the same numbers from its actual calls.
- broadcast: a pipelined chain root, root+1, ..., root+N-1: every rank but the root receives B,
  every rank but the chain's last sends B.
- allgather / allgatherv: the ring allgather: rank r sends every block but rank r+1's and
  receives every block but its own; for equal blocks (N-1) * B each way. An allgatherv without
  `counts` first allgathers one int64 length per rank, counted under "allgatherv" too.
- neighbour_exchange: actual: B to each ring neighbour and B from each (two messages each way,
  also at N = 2 where both neighbours are the same rank).
- reduce_scatter: the ring's first half with rank r ending on block r: rank r sends every
  block but its own and receives every block but rank r+1's ((N-1)/N * B each way for equal
  blocks).
- reduce (to one root): the broadcast's chain reversed: every rank but the root sends B, every
  rank but the chain's far end (root+N-1) receives B.
- barrier: no bytes, only time.

`seconds` is the wall time spent inside each collective (the ring's additions and the division
of an average included), so a trainer can split a step into communication and computation. A
communicator of one rank needs no MPI: every collective is the identity and counts no bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time
from typing import Any, Literal

import numpy as np

from d500.errors import D500Error

Buffer = Any  # a NumPy array or a torch CPU tensor (taken through a zero-copy .numpy() view)
Op = Literal["sum", "average"]
_RIGHTWARD, _LEFTWARD = 11, 12  # neighbour_exchange tags: the direction a message travels
_RING = 13


class CommError(D500Error):
    """A collective asked of something it cannot take (a GPU tensor, a read-only array, ...)."""


@dataclasses.dataclass
class Traffic:
    """What one collective has cost this rank since the last reset."""

    calls: int = 0
    sent: int = 0  # bytes
    received: int = 0  # bytes
    seconds: float = 0.0


def as_array(x: Buffer) -> np.ndarray:
    """`x` as a NumPy array sharing its memory: a NumPy array itself, a torch CPU tensor through
    `.detach().numpy()` (the same data pointer; torch is never imported here)."""
    if isinstance(x, np.ndarray):
        return x
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise CommError(f"the communicator takes CPU tensors, got one on {x.device}")
        try:
            return x.detach().numpy()
        except TypeError as err:  # e.g. bfloat16, which NumPy has no type for
            raise CommError(f"a torch tensor of {x.dtype} has no NumPy view: {err}") from None
    raise CommError(f"the communicator takes NumPy arrays or torch CPU tensors, got "
                    f"{type(x).__name__}")


def chunk_bounds(length: int, size: int) -> list[int]:
    """The N+1 element offsets of the ring's N chunks (numpy.array_split's layout: the first
    length % N chunks one element longer)."""
    q, extra = divmod(length, size)
    return [k * q + min(k, extra) for k in range(size + 1)]


@functools.lru_cache(maxsize=1024)
def ring_counts(length: int, size: int, rank: int) -> tuple[int, int]:
    """Elements rank `rank` sends and receives in a ring allreduce of `length` elements."""
    if size == 1:
        return 0, 0
    b = chunk_bounds(length, size)
    c = [b[k + 1] - b[k] for k in range(size)]
    return (2 * length - c[(rank + 1) % size] - c[(rank + 2) % size],
            2 * length - c[rank] - c[(rank + 1) % size])


def chain_counts(nbytes: int, size: int, rank: int, root: int) -> tuple[int, int]:
    """Bytes rank `rank` sends and receives in a chain broadcast of `nbytes` from `root`."""
    position = (rank - root) % size
    return (nbytes if position < size - 1 else 0), (nbytes if position > 0 else 0)


def gather_counts(block_bytes: list[int], rank: int) -> tuple[int, int]:
    """Bytes rank `rank` sends and receives in a ring allgather of blocks of these sizes."""
    size = len(block_bytes)
    if size == 1:
        return 0, 0
    total = sum(block_bytes)
    return total - block_bytes[(rank + 1) % size], total - block_bytes[rank]


class Communicator:
    """Collectives over an mpi4py communicator (or over one rank, without MPI), counted per
    collective name in `traffic`. Every collective must be called by every rank in the same
    order with buffers of the same shape and dtype (allgatherv: any lengths)."""

    def __init__(self, mpi: Any = None):
        self.mpi = mpi  # the mpi4py communicator; None for one rank
        self.rank = 0 if mpi is None else mpi.Get_rank()
        self.size = 1 if mpi is None else mpi.Get_size()
        self.left = (self.rank - 1) % self.size
        self.right = (self.rank + 1) % self.size
        self.traffic: dict[str, Traffic] = {}
        self._scratch = np.empty(0, dtype=np.uint8)
        self._in_place: Any = None
        if mpi is not None:
            from mpi4py import MPI
            self._in_place = MPI.IN_PLACE

    @classmethod
    def for_world(cls) -> Communicator:
        """COMM_WORLD when an MPI launcher started this process with other ranks, else one rank
        (mpi4py is then not imported)."""
        from d500.distributed.launch import world
        return cls(world())

    @classmethod
    def single(cls) -> Communicator:
        """A communicator of one rank: collectives are the identity and count no bytes."""
        return cls(None)

    # ------------------------------------------------------------------ counters
    @property
    def bytes_sent(self) -> int:
        return sum(t.sent for t in self.traffic.values())

    @property
    def bytes_received(self) -> int:
        return sum(t.received for t in self.traffic.values())

    @property
    def seconds(self) -> float:
        return sum(t.seconds for t in self.traffic.values())

    def reset(self) -> None:
        """Forget all counts (e.g. after warm-up steps)."""
        self.traffic.clear()

    def counters(self) -> dict[str, dict[str, float]]:
        """The counts as plain data, per collective name, for a record or a gather."""
        return {name: dataclasses.asdict(t) for name, t in self.traffic.items()}

    def _counting(self, name: str) -> _Clock:
        t = self.traffic.get(name)
        if t is None:
            t = self.traffic[name] = Traffic()
        return _Clock(t)

    # ------------------------------------------------------------------ collectives
    def allreduce(self, x: Buffer, op: Op = "sum") -> Buffer:
        """Sum (or average) `x` over all ranks in place with MPI_Allreduce; returns `x`.
        Counted as the ring algorithm would send it (see the module docstring)."""
        a = _writable(x)
        _check_op(a, op)
        with self._counting("allreduce") as t, _Flat(a) as flat:
            if self.mpi is not None and flat.size:
                self.mpi.Allreduce(self._in_place, flat)
                sent, received = ring_counts(flat.size, self.size, self.rank)
                t.sent += sent * flat.itemsize
                t.received += received * flat.itemsize
                if op == "average":
                    flat /= self.size
        return x

    def ring_allreduce(self, x: Buffer, op: Op = "sum") -> Buffer:
        """Sum (or average) `x` over all ranks in place with a ring on Sendrecv (Baidu's):
        N-1 reduce-scatter steps leave rank r with the total of chunk r+1, N-1 allgather steps
        pass the totals round. Any length (chunks may be empty) and any N; returns `x`."""
        a = _writable(x)
        _check_op(a, op)
        n, r = self.size, self.rank
        with self._counting("ring_allreduce") as t, _Flat(a) as flat:
            if self.mpi is None or not flat.size:
                return x
            b = chunk_bounds(flat.size, n)
            tmp = self._buffer(b[1] - b[0], flat.dtype)
            for s in range(n - 1):  # reduce-scatter
                send, recv = (r - s) % n, (r - s - 1) % n
                m = b[recv + 1] - b[recv]
                self._sendrecv(flat[b[send]:b[send + 1]], tmp[:m], _RING, t)
                np.add(flat[b[recv]:b[recv + 1]], tmp[:m], out=flat[b[recv]:b[recv + 1]])
            own = (r + 1) % n
            if op == "average":
                flat[b[own]:b[own + 1]] /= n
            for s in range(n - 1):  # allgather
                send, recv = (r + 1 - s) % n, (r - s) % n
                self._sendrecv(flat[b[send]:b[send + 1]], flat[b[recv]:b[recv + 1]], _RING, t)
        return x

    def broadcast(self, x: Buffer, root: int = 0) -> Buffer:
        """Rank `root`'s `x` into every rank's `x` in place (MPI_Bcast); returns `x`."""
        a = _writable(x)
        with self._counting("broadcast") as t, _Flat(a) as flat:
            if self.mpi is not None and flat.size:
                self.mpi.Bcast(flat, root=root)
                sent, received = chain_counts(flat.nbytes, self.size, self.rank, root)
                t.sent += sent
                t.received += received
        return x

    def reduce(self, x: Buffer, root: int = 0, op: Op = "sum") -> Buffer:
        """Sum (or average) `x` over all ranks into rank `root`'s `x` in place (MPI_Reduce);
        the other ranks' `x` are left as they were. Returns `x`. Counted as a pipelined chain
        root+N-1 -> ... -> root+1 -> root (the broadcast's chain reversed): every rank but the
        root sends B, every rank but the chain's far end (root+N-1) receives B."""
        a = _writable(x)
        _check_op(a, op)
        with self._counting("reduce") as t, _Flat(a) as flat:
            if self.mpi is not None and flat.size:
                if self.rank == root:
                    self.mpi.Reduce(self._in_place, flat, root=root)
                    if op == "average":
                        flat /= self.size
                else:
                    self.mpi.Reduce(flat, None, root=root)
                received, sent = chain_counts(flat.nbytes, self.size, self.rank, root)
                t.sent += sent
                t.received += received
        return x

    def reduce_scatter(self, x: Buffer, counts: list[int], op: Op = "sum") -> np.ndarray:
        """The sum (or average) over ranks of block `rank` of `x` (flattened; blocks of
        `counts` elements in rank order, summing to its length), in a new array
        (MPI_Reduce_scatter). Counted as the module docstring says."""
        a, out = self._scattered(x, counts, op, "reduce_scatter")
        with self._counting("reduce_scatter") as t:
            if self.mpi is None:
                out[:] = a
                return out
            if a.size:
                self.mpi.Reduce_scatter(a, out, recvcounts=list(counts))
                if op == "average":
                    out /= self.size
            self._count_scatter(t, a, counts)
        return out

    def allgather(self, x: Buffer, out: Buffer | None = None) -> Any:
        """Every rank's `x` (equal shapes), stacked: shape (N, *x.shape), rank order
        (MPI_Allgather). Written into `out` when given (and returned), else a new array."""
        a = np.ascontiguousarray(as_array(x))
        if out is None:
            res = np.empty((self.size, *a.shape), dtype=a.dtype)
            out = res
        else:
            res = _writable(out)
            if res.shape != (self.size, *a.shape) or res.dtype != a.dtype:
                raise CommError(f"allgather: out must be {a.dtype} of shape "
                                f"{(self.size, *a.shape)}, got {res.dtype} {res.shape}")
        with self._counting("allgather") as t, _Flat(res) as flat:
            if self.mpi is None:
                flat[:] = a.reshape(-1)
            elif a.size:
                self.mpi.Allgather(a.reshape(-1), flat)
                sent, received = gather_counts([a.nbytes] * self.size, self.rank)
                t.sent += sent
                t.received += received
        return out

    def allgatherv(self, x: Buffer, counts: list[int] | None = None) -> list[np.ndarray]:
        """Every rank's flattened `x`, whatever its length (MPI_Allgatherv): a list in rank
        order of 1-D views into one receive buffer. Pass `counts` (elements per rank) when every
        rank knows them, else they are allgathered first (8 bytes per rank, counted)."""
        a = np.ascontiguousarray(as_array(x)).reshape(-1)
        with self._counting("allgatherv") as t:
            if self.mpi is None:
                return [a.copy()]
            if counts is None:
                lengths = np.empty(self.size, dtype=np.int64)
                self.mpi.Allgather(np.array([a.size], dtype=np.int64), lengths)
                sent, received = gather_counts([8] * self.size, self.rank)
                t.sent += sent
                t.received += received
                counts = [int(c) for c in lengths]
            res, displacements, blocks = self._gathering(t, a, counts, "allgatherv")
            if res.size:
                self.mpi.Allgatherv(a, [res, (list(counts), displacements)])
            return blocks

    def iallgatherv(self, x: Buffer, counts: list[int]) -> Pending:
        """Start allgatherv(`x`, `counts`) (MPI_Iallgatherv); `.wait()` returns its list of
        blocks. Counted as allgatherv (bytes when started; seconds: starting and waiting)."""
        a = np.ascontiguousarray(as_array(x)).reshape(-1)
        clock = self._counting("allgatherv")
        if self.mpi is None:
            with clock:
                return Pending(None, [a.copy()], clock)
        with clock as t:
            res, displacements, blocks = self._gathering(t, a, counts, "iallgatherv")
            request = self.mpi.Iallgatherv(a, [res, (list(counts), displacements)])
        return Pending(request, blocks, clock, keep=a)

    def ireduce_scatter(self, x: Buffer, counts: list[int], op: Op = "sum") -> Pending:
        """Start reduce_scatter(`x`, `counts`, `op`) (MPI_Ireduce_scatter); `.wait()` returns
        this rank's block. Counted as reduce_scatter (bytes when started)."""
        a, out = self._scattered(x, counts, op, "ireduce_scatter")
        clock = self._counting("reduce_scatter")
        if self.mpi is None:
            with clock:
                out[:] = a
                return Pending(None, out, clock)
        with clock as t:
            request = self.mpi.Ireduce_scatter(a, out, recvcounts=list(counts))
            self._count_scatter(t, a, counts)
        return Pending(request, out, clock, keep=a, divide=self.size if op == "average" else 1)

    def neighbour_exchange(self, x: Buffer, out_left: Buffer | None = None,
                           out_right: Buffer | None = None) -> tuple[Any, Any]:
        """Send `x` to both ring neighbours and receive theirs: returns (left's x, right's x),
        written into `out_left`/`out_right` when given. At N = 2 both are the other rank's x (two
        messages each way, told apart by tag); at N = 1 both are copies of `x`."""
        a = np.ascontiguousarray(as_array(x))
        outs = [np.empty_like(a) if o is None else o for o in (out_left, out_right)]
        for o in outs:
            if _writable(o).shape != a.shape or as_array(o).dtype != a.dtype:
                raise CommError(f"neighbour_exchange: outputs must be {a.dtype} of shape "
                                f"{a.shape}, got {as_array(o).dtype} {as_array(o).shape}")
        with self._counting("neighbour_exchange") as t, \
                _Flat(as_array(outs[0])) as from_left, _Flat(as_array(outs[1])) as from_right:
            flat = a.reshape(-1)
            if self.mpi is None:
                from_left[:] = flat
                from_right[:] = flat
            elif flat.size:
                m = self.mpi
                requests = [m.Irecv(from_left, source=self.left, tag=_RIGHTWARD),
                            m.Irecv(from_right, source=self.right, tag=_LEFTWARD),
                            m.Isend(flat, dest=self.right, tag=_RIGHTWARD),
                            m.Isend(flat, dest=self.left, tag=_LEFTWARD)]
                _waitall(requests)
                t.sent += 2 * flat.nbytes
                t.received += 2 * flat.nbytes
        return outs[0], outs[1]

    def barrier(self) -> None:
        """Wait for every rank (MPI_Barrier); counts time, no bytes."""
        with self._counting("barrier"):
            if self.mpi is not None:
                self.mpi.Barrier()

    # ------------------------------------------------------------------ point to point
    def isend(self, x: Buffer, dest: int, tag: int = 0) -> Any:
        """Start sending `x` to rank `dest` (MPI_Isend) and return its request (None at one
        rank); `x` must stay unchanged until `wait` on it returns. Counted under "send"."""
        a = np.ascontiguousarray(as_array(x))
        with self._counting("send") as t:
            if self.mpi is None:
                return None
            t.sent += a.nbytes
            return self.mpi.Isend(a.reshape(-1), dest=dest, tag=tag)

    def recv(self, out: Buffer, source: int, tag: int = 0, poll: float = 0.0) -> Buffer:
        """Receive into `out` from rank `source` (MPI_Irecv, then tests `poll` s apart: a
        waiting rank sleeps instead of spinning a core another rank needs). Counted under
        "recv", the waiting included."""
        with self._counting("recv") as t, _Flat(_writable(out)) as flat:
            if self.mpi is not None:
                request = self.mpi.Irecv(flat, source=source, tag=tag)
                while not request.Test():
                    time.sleep(poll)
                t.received += flat.nbytes
        return out

    def wait(self, requests: list[Any]) -> None:
        """Complete `isend`s (its seconds counted under "send", no call)."""
        pending = [r for r in requests if r is not None]
        if pending:
            t = self.traffic.setdefault("send", Traffic())
            start = time.perf_counter()
            _waitall(pending)
            t.seconds += time.perf_counter() - start

    # ------------------------------------------------------------------ helpers
    def _sendrecv(self, send: np.ndarray, recv: np.ndarray, tag: int, t: Traffic) -> None:
        self.mpi.Sendrecv(send, dest=self.right, sendtag=tag, recvbuf=recv, source=self.left,
                          recvtag=tag)
        t.sent += send.nbytes
        t.received += recv.nbytes

    def _gathering(self, t: Traffic, a: np.ndarray, counts: list[int], name: str
                   ) -> tuple[np.ndarray, list[int], list[np.ndarray]]:
        """An allgatherv's `counts` checked, its bytes counted into `t`, and its receive buffer,
        the blocks' displacements and the blocks (views into the buffer, in rank order)."""
        if len(counts) != self.size or counts[self.rank] != a.size:
            raise CommError(f"{name}: counts {counts} do not give rank {self.rank}'s "
                            f"{a.size} elements for {self.size} ranks")
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(int)
        res = np.empty(int(offsets[-1]), dtype=a.dtype)
        sent, received = gather_counts([c * a.itemsize for c in counts], self.rank)
        t.sent += sent
        t.received += received
        blocks = [res[offsets[i]:offsets[i + 1]] for i in range(self.size)]
        return res, list(offsets[:-1]), blocks

    def _scattered(self, x: Buffer, counts: list[int], op: Op, name: str
                   ) -> tuple[np.ndarray, np.ndarray]:
        """A reduce-scatter's arguments checked: `x` flat, and an empty block for this rank."""
        a = np.ascontiguousarray(as_array(x)).reshape(-1)
        _check_op(a, op)
        if len(counts) != self.size or sum(counts) != a.size:
            raise CommError(f"{name}: counts {counts} do not split {a.size} elements "
                            f"among {self.size} ranks")
        return a, np.empty(counts[self.rank], dtype=a.dtype)

    def _count_scatter(self, t: Traffic, a: np.ndarray, counts: list[int]) -> None:
        """A reduce-scatter's bytes of `a`, as the module docstring says."""
        blocks = [c * a.itemsize for c in counts]
        t.sent += a.nbytes - blocks[self.rank]
        t.received += a.nbytes - blocks[(self.rank + 1) % self.size]

    def _buffer(self, n: int, dtype: np.dtype) -> np.ndarray:
        """A scratch array of n elements, reused between calls."""
        nbytes = n * dtype.itemsize
        if self._scratch.nbytes < nbytes:
            self._scratch = np.empty(nbytes, dtype=np.uint8)
        return self._scratch[:nbytes].view(dtype)


def _writable(x: Buffer) -> np.ndarray:
    a = as_array(x)
    if not a.flags.writeable:
        raise CommError("the communicator works in place and was given a read-only array")
    return a


def _check_op(a: np.ndarray, op: str) -> None:
    if op not in ("sum", "average"):
        raise CommError(f"unknown reduction {op!r}: use 'sum' or 'average'")
    if op == "average" and not np.issubdtype(a.dtype, np.inexact):
        raise CommError(f"an average of {a.dtype} arrays is not {a.dtype}: reduce with 'sum'")


class Pending:
    """A started collective (Communicator.iallgatherv, .ireduce_scatter): `wait()` finishes it
    and returns its result. Waiting tests the request and yields the core between tests (a
    waiting rank does not spin a core the other ranks compute on); its seconds count under the
    collective's name, the call once, when started."""

    __slots__ = ("request", "result", "clock", "keep", "divide")

    def __init__(self, request: Any, result: Any, clock: _Clock, keep: Any = None,
                 divide: int = 1):
        self.request, self.result, self.clock = request, result, clock
        self.keep, self.divide = keep, divide  # the send buffer, alive until done; an average's N

    def wait(self) -> Any:
        if self.request is not None:
            t = self.clock.traffic
            start = time.perf_counter()
            while not self.request.Test():
                os.sched_yield()  # other processes run; MPI progresses on each Test
            if self.divide > 1:
                self.result /= self.divide
            t.seconds += time.perf_counter() - start
            self.request, self.keep = None, None
        return self.result


class _Clock:
    """Counts a call and its seconds into a Traffic (a class: cheaper than @contextmanager)."""

    __slots__ = ("start", "traffic")

    def __init__(self, traffic: Traffic):
        self.traffic = traffic
        self.start = 0.0

    def __enter__(self) -> Traffic:
        self.start = time.perf_counter()
        return self.traffic

    def __exit__(self, *exc: object) -> None:
        self.traffic.calls += 1
        self.traffic.seconds += time.perf_counter() - self.start


class _Flat:
    """A 1-D view of `a`; for a non-contiguous `a` a contiguous copy, written back on exit."""

    __slots__ = ("a", "flat")

    def __init__(self, a: np.ndarray):
        self.a = a
        self.flat = a.reshape(-1) if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(-1)

    def __enter__(self) -> np.ndarray:
        return self.flat

    def __exit__(self, kind: object, *exc: object) -> None:
        if kind is None and not self.a.flags.c_contiguous:
            self.a[...] = self.flat.reshape(self.a.shape)


def _waitall(requests: list[Any]) -> None:
    from mpi4py import MPI
    MPI.Request.Waitall(requests)
