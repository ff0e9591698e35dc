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
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

import numpy as np

from d500.distributed.schemes.base import Option, register
from d500.distributed.schemes.server import Flat, Served
from d500.errors import UsageError


@register
class AsyncPS(Served):
    """Asynchronous parameter server at rank 0 (server and worker) with staleness <= K."""

    name = "async_ps"
    PUSH, PULL = 31, 32  # message tags
    options: ClassVar[dict[str, Option]] = {
        "max_staleness": Option(4, "whole", "most versions a gradient may be behind when it "
                                            "is applied (K)")}

    def __init__(self, trainer: Any, comm: Any, **kwargs: Any):
        super().__init__(trainer, comm, **kwargs)
        self.staleness: list[int] = []  # rank 0: of every applied gradient, in order
        self.started = False
        if self.rank == 0:
            self._server_init()
        else:
            self.version: int | None = None  # the read this rank holds (None: wait for one)
            self.have = 0  # the version of the parameters in the model

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
        self._close()
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
            self.version = self.have = self._pull(self.have)
        loss, grads = self.gradients(feeds, weight)
        self._push(grads, self.version, lr)
        self.version = None
        return loss

    # ------------------------------------------------------------------ the server (rank 0)
    def _server_init(self) -> None:
        workers = range(1, self.size)
        self.version_now = 0  # V: gradients applied so far
        self.reads: dict[int, int] = {}  # worker (0 = rank 0's own) -> version of its read
        self.waiting: collections.deque[int] = collections.deque()  # workers wanting a read
        self.next_step = dict.fromkeys(workers, 1)  # the step a worker's next read is for
        self.arrived: list[int] = []  # workers whose gradient waits in its box, by arrival
        self.sent_version: dict[int, int] = dict.fromkeys(workers, 0)
        self.applied = dict.fromkeys(workers, 0)  # gradients applied per worker
        self.own: tuple[int, float, dict[str, np.ndarray]] | None = None
        self.waiting.extend(workers)

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

    def _stuck(self) -> str:
        return (f"async_ps: rank 0 waits with nothing to come (reads {self.reads}, waiting "
                f"{list(self.waiting)}, applied {self.applied}, steps {self.steps})")

    def _receive(self, block: bool) -> bool:
        """Gradients that have arrived (block: wait for one); whether any did."""
        expected = [w for w, r in self.requests.items()
                    if r is not None and w in self.reads and w not in self.arrived]
        done = self._arrivals(expected, block)
        self.arrived.extend(done)
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

    def _hand_out(self) -> bool:
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
        self._send(w, self.version_now, held=self.sent_version[w] == self.version_now)
        self.sent_version[w] = self.version_now
