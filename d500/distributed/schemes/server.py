"""What the parameter servers without a global barrier share (async_ps, ssp): rank 0 serves and
trains; the other ranks push gradients and pull parameters over Isend/Irecv of NumPy buffers in one
fixed layout (Flat: a 16-byte header, int64 version and float64 learning rate, then the float32
arrays; never pickled), each message counted under "ps_push" or "ps_pull"."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from d500.distributed.comm import Traffic
from d500.distributed.schemes.base import Scheme
from d500.errors import ConfigError

HEADER = 16  # bytes: int64 version, float64 learning rate


class Flat:
    """A fixed layout of named float32 arrays in one byte buffer after a 16-byte header."""

    def __init__(self, arrays: Mapping[str, np.ndarray], owner: str = "a parameter server"):
        for name, a in arrays.items():
            if a.dtype != np.float32:
                raise ConfigError(f"{owner} sends float32 parameters; '{name}' is {a.dtype}")
        self.shapes = {n: a.shape for n, a in arrays.items()}
        self.offsets, n = {}, 0
        for name, a in arrays.items():
            self.offsets[name] = n
            n += a.size
        self.elements = n
        self.nbytes = HEADER + 4 * n

    def buffer(self) -> np.ndarray:
        return np.zeros(self.nbytes, dtype=np.uint8)

    def views(self, buffer: np.ndarray) -> dict[str, np.ndarray]:
        """The arrays inside `buffer` (writable views, no copy)."""
        data = buffer[HEADER:].view(np.float32)
        return {n: data[o:o + int(np.prod(s, dtype=np.int64))].reshape(s)
                for (n, s), o in zip(self.shapes.items(), self.offsets.values())}

    def pack(self, buffer: np.ndarray, arrays: Mapping[str, np.ndarray], version: int,
             lr: float = 0.0) -> None:
        buffer[:8].view(np.int64)[0] = version
        buffer[8:16].view(np.float64)[0] = lr
        for name, view in self.views(buffer).items():
            np.copyto(view, arrays[name])

    @staticmethod
    def header(buffer: np.ndarray) -> tuple[int, float]:
        return int(buffer[:8].view(np.int64)[0]), float(buffer[8:16].view(np.float64)[0])


class Served(Scheme):
    """The buffers, messages and serving loop of a parameter server at rank 0 (module docstring).
    Subclasses set the tags PUSH and PULL and write the server's `_receive`, `_apply_ready`,
    `_hand_out` (each: whether it did anything) and `_stuck` (why rank 0 cannot go on)."""

    PUSH: ClassVar[int] = 0
    PULL: ClassVar[int] = 0
    unresumable: ClassVar[str] = ("which gradients rank 0 applied, and how stale, depends on the "
                                  "ranks' timing: no checkpoint continues it as it would have")

    def __init__(self, trainer: Any, comm: Any, **kwargs: Any):
        super().__init__(trainer, comm, **kwargs)
        self.flat = Flat(trainer.parameters(), f"scheme '{self.name}'")
        self.wait_seconds = 0.0  # blocked: a worker for its parameters, rank 0 for gradients
        workers = range(1, self.size)
        if self.rank == 0:
            self.boxes = {w: self.flat.buffer() for w in workers}  # their gradients land here
            self.requests: dict[int, Any] = dict.fromkeys(workers)  # the Irecv into each box
            self.replies = {w: self.flat.buffer() for w in workers}  # parameters sent to each
            self.replying: dict[int, Any] = dict.fromkeys(workers)
        else:
            self.inbox = self.flat.buffer()  # parameters from rank 0
            self.outbox = self.flat.buffer()  # this rank's gradient
            self.sending: Any = None  # the Isend of outbox

    def _count(self, name: str, sent: int = 0, received: int = 0, seconds: float = 0.0,
               calls: int = 1) -> None:
        """Count a message (or a wait: calls=0) under comm.traffic[name]."""
        t = self.comm.traffic.setdefault(name, Traffic())
        t.calls += calls
        t.sent += sent
        t.received += received
        t.seconds += seconds

    # ------------------------------------------------------------------ a worker (rank > 0)
    def _pull(self, have: int) -> int:
        """Wait for rank 0's parameters (or its "keep yours" header when this rank holds
        version `have` already); the version now held."""
        from mpi4py import MPI
        status = MPI.Status()
        start = time.perf_counter()
        self.comm.mpi.Recv(self.inbox, source=0, tag=self.PULL, status=status)
        waited = time.perf_counter() - start
        self.wait_seconds += waited
        size = status.Get_count(MPI.BYTE)
        self._count("ps_pull", received=size, seconds=waited)
        version = Flat.header(self.inbox)[0]
        if size > HEADER:
            arrays = self.params.get()
            for name, view in self.flat.views(self.inbox).items():
                np.copyto(arrays[name], view)
            self.params.put(arrays)
        elif version != have:
            raise RuntimeError(f"{self.name}: rank {self.rank} holds version {have}, rank 0 "
                               f"sent {version} without parameters")
        return version

    def _push(self, grads: Mapping[str, np.ndarray], version: int, lr: float) -> None:
        """This rank's gradient, computed on `version`, to rank 0 (not waited for)."""
        start = time.perf_counter()
        if self.sending is not None:
            self.sending.Wait()
        self.flat.pack(self.outbox, grads, version, lr)
        self.sending = self.comm.mpi.Isend(self.outbox, dest=0, tag=self.PUSH)
        self._count("ps_push", sent=self.flat.nbytes, seconds=time.perf_counter() - start)

    # ------------------------------------------------------------------ the server (rank 0)
    def _post(self, w: int) -> None:
        self.requests[w] = self.comm.mpi.Irecv(self.boxes[w], source=w, tag=self.PUSH)

    def _send(self, w: int, version: int, held: bool) -> None:
        """Rank 0's parameters at `version` to worker `w` (a header alone where it `held` them)."""
        start = time.perf_counter()
        if self.replying[w] is not None:
            self.replying[w].Wait()
        box = self.replies[w]
        if held:
            box[:8].view(np.int64)[0] = version
            size = HEADER
        else:
            self.flat.pack(box, self.params.get(), version)
            size = self.flat.nbytes
        self.replying[w] = self.comm.mpi.Isend(box[:size], dest=w, tag=self.PULL)
        self._count("ps_pull", sent=size, seconds=time.perf_counter() - start)

    def _arrivals(self, workers: list[int], block: bool) -> list[int]:
        """The workers among `workers` whose pushed gradient has arrived in its box (block:
        wait for one); their receives are done (post again to receive more)."""
        if self.comm.mpi is None or not workers:
            return []
        from mpi4py import MPI
        requests = [self.requests[w] for w in workers]
        done = [MPI.Request.Waitany(requests)] if block else (
            MPI.Request.Testsome(requests) or [])
        for i in done:
            self.requests[workers[i]] = None
            self._count("ps_push", received=self.flat.nbytes)
        return [workers[i] for i in done]

    def _serve(self, until: Any) -> None:
        """Receive, apply and hand out until `until()` holds, blocking on the next push when
        nothing can be done."""
        while True:
            progress = self._receive(block=False)
            progress = self._apply_ready() or progress
            progress = self._hand_out() or progress
            if until():
                return
            if not progress:
                start = time.perf_counter()
                if not self._receive(block=True):
                    raise RuntimeError(self._stuck())
                waited = time.perf_counter() - start
                self.wait_seconds += waited
                self._count("ps_push", seconds=waited, calls=0)

    def _close(self) -> None:
        """Cancel rank 0's idle receives and complete every send in flight."""
        if self.rank == 0:
            for w, request in self.requests.items():
                if request is not None:
                    request.Cancel()
                    request.Wait()
                    self.requests[w] = None
            for w, request in self.replying.items():
                if request is not None:
                    request.Wait()
                    self.replying[w] = None
        elif self.sending is not None:
            self.sending.Wait()
            self.sending = None

    def _receive(self, block: bool) -> bool:
        raise NotImplementedError

    def _apply_ready(self) -> bool:
        raise NotImplementedError

    def _hand_out(self) -> bool:
        raise NotImplementedError

    def _stuck(self) -> str:
        return f"{self.name}: rank 0 waits with nothing to come"
