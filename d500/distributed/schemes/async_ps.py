"""The asynchronous parameter server with bounded, measured staleness. Rank 0 is server AND worker
(its share of the data counts like any rank's; on a 2-core machine a server-only rank would leave
one worker and nothing asynchronous): it computes its own gradients and, between them, applies the
other ranks' gradients one at a time as they arrive. No global barrier: each worker pushes its
gradient (tagged with the version of the parameters it was computed on) and pulls the parameters
the server sends back, over Isend/Irecv of NumPy buffers (never pickled).

Staleness of an applied gradient = versions applied between its read and its own application
(0: nobody else's update intervened). The server keeps it <= K = max_staleness for every gradient:
- a "read" (a version handed to a worker) is issued only if every read outstanding, the new one
  included, can still be applied within K: with b_r = K - (V - v_r) the budget of read r at
  version V, the budgets sorted ascending must satisfy b_(j) >= j; at most K + 1 reads are out;
- a gradient is applied only if the reads still outstanding afterwards keep that property; the
  oldest read always can, so the server never deadlocks; a gradient that cannot be applied yet
  waits in its receive buffer, and its worker waits for its next parameters ("a worker more than
  K versions behind waits").
Reads are handed out first come, first served. A worker's read for its step j is issued only once
rank 0 has entered its own step j, so rank 0 never waits for a step another rank will only take
after an evaluation. `evaluated()` and `finish()` drain (every rank's gradients up to the common
step are applied) and broadcast the server's parameters, so all ranks hold the scheme's model.

Messages (model of n float32 parameters; header 16 bytes: int64 version, float64 lr):
- push, worker -> rank 0 ("ps_push"): 16 + 4n bytes per step from every rank but 0;
- pull, rank 0 -> worker ("ps_pull"): 16 + 4n bytes per read issued (16 when the worker already
  holds that version), so about one per step per rank but 0.
Per step: a rank r > 0 sends 16 + 4n and receives <= 16 + 4n; rank 0 receives (N-1)(16 + 4n) and
sends <= (N-1)(16 + 4n); rank 0's own gradient does not travel.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

import numpy as np

from d500.distributed.comm import Traffic
from d500.distributed.schemes.base import Option, Scheme, register
from d500.errors import ConfigError, UsageError

PUSH, PULL = 31, 32  # message tags
HEADER = 16  # bytes: int64 version, float64 learning rate


class Flat:
    """A fixed layout of named float32 arrays in one byte buffer after a 16-byte header."""

    def __init__(self, arrays: Mapping[str, np.ndarray]):
        for name, a in arrays.items():
            if a.dtype != np.float32:
                raise ConfigError(f"scheme 'async_ps' sends float32 parameters; '{name}' is "
                                  f"{a.dtype}")
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


@register
class AsyncPS(Scheme):
    """Asynchronous parameter server at rank 0 (server and worker) with staleness <= K."""

    name = "async_ps"
    options: ClassVar[dict[str, Option]] = {
        "max_staleness": Option(4, "whole", "most versions a gradient may be behind when it "
                                            "is applied (K)")}

    def __init__(self, trainer: Any, comm: Any, **kwargs: Any):
        super().__init__(trainer, comm, **kwargs)
        self.flat = Flat(trainer.parameters())
        self.wait_seconds = 0.0  # blocked: a worker for its parameters, rank 0 for gradients
        self.staleness: list[int] = []  # rank 0: of every applied gradient, in order
        self.started = False
        if self.rank == 0:
            self._server_init()
        else:
            self.inbox = self.flat.buffer()  # parameters from rank 0
            self.outbox = self.flat.buffer()  # this rank's gradient
            self.sending: Any = None  # the Isend of outbox
            self.version: int | None = None  # the read this rank holds (None: wait for one)
            self.have = 0  # the version of the parameters in the model

    # ------------------------------------------------------------------ traffic
    def _count(self, name: str, sent: int = 0, received: int = 0, seconds: float = 0.0,
               calls: int = 1) -> None:
        """Count a message (or a wait: calls=0) under comm.traffic[name]."""
        t = self.comm.traffic.get(name)
        if t is None:
            t = self.comm.traffic[name] = Traffic()
        t.calls += calls
        t.sent += sent
        t.received += received
        t.seconds += seconds

    # ------------------------------------------------------------------ the interface
    def start(self) -> None:
        self.broadcast_parameters()
        self.started = True
        if self.rank == 0:
            self.sent_version = dict.fromkeys(range(1, self.size), 0)
            for w in range(1, self.size):
                self._post(w)
        else:
            self.have = 0

    def step(self, feeds: Mapping[str, np.ndarray], lr: float, weight: float = 1.0
             ) -> float:
        if not self.started:
            raise UsageError("scheme 'async_ps': call start() before step()")
        self.steps += 1
        if self.rank == 0:
            return self._server_step(feeds, lr, weight)
        return self._worker_step(feeds, lr, weight)

    def _finish(self) -> None:
        """Every rank gets the server's parameters; the idle receives are cancelled."""
        self._share_model()
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
        elif self.rank != 0 and self.sending is not None:
            self.sending.Wait()
            self.sending = None
        self.started = False

    def settle(self) -> None:
        """rank 0 applies every rank's gradients of the steps taken so far (training traffic)."""
        if self.rank == 0:
            self._drain()

    @contextmanager
    def _evaluate(self) -> Iterator[None]:
        """The server's model on every rank (broadcast after `settle`)."""
        self._share_model()
        yield

    def _share_model(self) -> None:
        self.broadcast_parameters()
        if self.rank != 0:
            self.have = self._broadcast_version
            self.version = None
        else:
            self.sent_version = dict.fromkeys(range(1, self.size), self.version_now)

    def figures(self) -> dict[str, float]:
        out = {"wait_seconds": self.wait_seconds}
        if self.rank == 0 and self.staleness:
            s = np.asarray(self.staleness)
            out.update(staleness_mean=float(s.mean()), staleness_max=float(s.max()),
                       gradients_applied=float(s.size), max_staleness=float(self.max_staleness))
        return out

    def details(self) -> dict[str, Any]:
        """rank 0: staleness_histogram[s] = how many applied gradients were s versions behind."""
        if self.rank != 0 or not self.staleness:
            return {}
        return {"staleness_histogram": np.bincount(self.staleness).tolist()}

    # ------------------------------------------------------------------ a worker (rank > 0)
    def broadcast_parameters(self, root: int = 0) -> None:
        """Rank 0's parameters and version to every rank (the base broadcast, plus the version)."""
        super().broadcast_parameters(root)
        version = np.array([self.version_now if self.rank == 0 else 0], dtype=np.int64)
        self.comm.broadcast(version, root)
        self._broadcast_version = int(version[0])

    def _worker_step(self, feeds: Mapping[str, np.ndarray], lr: float, weight: float
                     ) -> float:
        if self.version is None:  # wait for a read: rank 0's parameters at some version
            from mpi4py import MPI
            status = MPI.Status()
            start = time.perf_counter()
            self.comm.mpi.Recv(self.inbox, source=0, tag=PULL, status=status)
            waited = time.perf_counter() - start
            self.wait_seconds += waited
            size = status.Get_count(MPI.BYTE)
            self.version = Flat.header(self.inbox)[0]
            self._count("ps_pull", received=size, seconds=waited)
            if size > HEADER:
                arrays = self.params.get()
                for name, view in self.flat.views(self.inbox).items():
                    np.copyto(arrays[name], view)
                self.params.put(arrays)
            elif self.version != self.have:
                raise RuntimeError(f"async_ps: rank {self.rank} holds version {self.have}, "
                                   f"rank 0 sent {self.version} without parameters")
            self.have = self.version
        loss, grads = self.gradients(feeds, weight)
        start = time.perf_counter()
        if self.sending is not None:
            self.sending.Wait()
        self.flat.pack(self.outbox, grads, self.version, lr)
        self.sending = self.comm.mpi.Isend(self.outbox, dest=0, tag=PUSH)
        self._count("ps_push", sent=self.flat.nbytes, seconds=time.perf_counter() - start)
        self.version = None
        return loss

    # ------------------------------------------------------------------ the server (rank 0)
    def _server_init(self) -> None:
        workers = range(1, self.size)
        self.version_now = 0  # V: gradients applied so far
        self.reads: dict[int, int] = {}  # worker (0 = rank 0's own) -> version of its read
        self.waiting: collections.deque[int] = collections.deque()  # workers wanting a read
        self.next_step = dict.fromkeys(workers, 1)  # the step a worker's next read is for
        self.boxes = {w: self.flat.buffer() for w in workers}  # their gradients land here
        self.requests: dict[int, Any] = dict.fromkeys(workers)  # the Irecv into each box
        self.arrived: list[int] = []  # workers whose gradient waits in its box, by arrival
        self.replies = {w: self.flat.buffer() for w in workers}  # parameters sent to each
        self.replying: dict[int, Any] = dict.fromkeys(workers)
        self.sent_version: dict[int, int] = dict.fromkeys(workers, 0)
        self.applied = dict.fromkeys(workers, 0)  # gradients applied per worker
        self.own: tuple[int, float, dict[str, np.ndarray]] | None = None
        self.waiting.extend(workers)

    def _post(self, w: int) -> None:
        self.requests[w] = self.comm.mpi.Irecv(self.boxes[w], source=w, tag=PUSH)

    def _server_step(self, feeds: Mapping[str, np.ndarray], lr: float, weight: float
                     ) -> float:
        self.waiting.append(0)
        self._serve(until=lambda: 0 in self.reads)  # rank 0's own read, first come first served
        version = self.reads[0]
        loss, grads = self.gradients(feeds, weight)
        self.own = (version, lr, grads)
        self._serve(until=lambda: self.own is None)
        return loss

    def _drain(self) -> None:
        """Apply every rank's gradients of the steps taken so far (every rank has taken
        `self.steps`); no read for a later step is issued."""
        self._serve(until=lambda: all(n == self.steps for n in self.applied.values()))

    def _serve(self, until: Any) -> None:
        """Receive, apply and hand out reads until `until()` holds, blocking when nothing can
        be done (a gradient that will come is then awaited)."""
        while True:
            progress = self._receive(block=False)
            progress = self._apply_ready() or progress
            progress = self._issue_reads() or progress
            if until():
                return
            if not progress:
                start = time.perf_counter()
                if not self._receive(block=True):
                    raise RuntimeError(f"async_ps: rank 0 waits with nothing to come (reads "
                                       f"{self.reads}, waiting {list(self.waiting)}, applied "
                                       f"{self.applied}, steps {self.steps})")
                waited = time.perf_counter() - start
                self.wait_seconds += waited
                self._count("ps_push", seconds=waited, calls=0)

    def _receive(self, block: bool) -> bool:
        """Gradients that have arrived (block: wait for one); whether any did."""
        if self.comm.mpi is None:
            return False
        from mpi4py import MPI
        expected = [w for w, r in self.requests.items()
                    if r is not None and w in self.reads and w not in self.arrived]
        if not expected:
            return False
        requests = [self.requests[w] for w in expected]
        if block:
            index = MPI.Request.Waitany(requests)
            done = [index]
        else:
            done = MPI.Request.Testsome(requests) or []
        for i in done:
            w = expected[i]
            self.requests[w] = None
            self.arrived.append(w)
            self._count("ps_push", received=self.flat.nbytes)
        return bool(done)

    def _feasible(self, versions: list[int], at: int) -> bool:
        """Whether reads at `versions` can all be applied within K from version `at` on."""
        budgets = sorted(self.max_staleness - (at - v) for v in versions)
        return all(b >= j for j, b in enumerate(budgets))

    def _apply_ready(self) -> bool:
        """Apply, in arrival order, every waiting gradient the staleness bound allows."""
        progress = True
        any_applied = False
        while progress:
            progress = False
            candidates = list(self.arrived) + ([0] if self.own is not None else [])
            for w in candidates:
                others = [v for u, v in self.reads.items() if u != w]
                if not self._feasible(others, self.version_now + 1):
                    continue
                self._apply(w)
                progress = any_applied = True
                break
        return any_applied

    def _apply(self, w: int) -> None:
        read = self.reads.pop(w)
        stale = self.version_now - read
        if stale > self.max_staleness:  # the invariant the gates keep
            raise RuntimeError(f"async_ps: a gradient {stale} versions stale (bound "
                               f"{self.max_staleness})")
        if w == 0:
            _, lr, grads = self.own
            self.own = None
        else:
            box = self.boxes[w]
            version, lr = Flat.header(box)
            if version != read:
                raise RuntimeError(f"async_ps: rank {w} pushed a gradient of version {version}"
                                   f", its read was {read}")
            grads = self.flat.views(box)
            self.arrived.remove(w)
        self.trainer.apply(grads, lr)
        self.version_now += 1
        self.staleness.append(stale)
        if w != 0:
            self.applied[w] += 1
            self.next_step[w] += 1
            self._post(w)
            self.waiting.append(w)

    def _issue_reads(self) -> bool:
        """Hand out reads to waiting workers, first come first served, while the bound allows;
        a worker's read for step j waits until rank 0 has entered its step j."""
        issued = False
        for w in list(self.waiting):
            if w != 0 and self.next_step[w] > self.steps:
                continue
            if not self._feasible([*self.reads.values(), self.version_now], self.version_now):
                break
            self.waiting.remove(w)
            self.reads[w] = self.version_now
            issued = True
            if w != 0:
                self._send_read(w)
        return issued

    def _send_read(self, w: int) -> None:
        start = time.perf_counter()
        if self.replying[w] is not None:
            self.replying[w].Wait()
        box = self.replies[w]
        if self.sent_version[w] == self.version_now:  # it holds these parameters already
            box[:8].view(np.int64)[0] = self.version_now
            size = HEADER
        else:
            self.flat.pack(box, self.params.get(), self.version_now)
            size = self.flat.nbytes
        self.replying[w] = self.comm.mpi.Isend(box[:size], dest=w, tag=PULL)
        self.sent_version[w] = self.version_now
        self._count("ps_pull", sent=size, seconds=time.perf_counter() - start)
