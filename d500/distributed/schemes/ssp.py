"""The stale-synchronous parameter server (Ho et al., NIPS'13: SSP), between ps and async_ps: the
update of clock c is, as ps's, the average of every rank's gradient of step c, applied in clock
order; but a rank may compute step c on parameters that miss the last s clocks (bounded staleness
s), so it waits for the server only when it is more than s clocks ahead of the slowest rank.

Rank 0 is server and worker (as in async_ps). Version V = clocks applied. A rank computes step c
on parameters of some version v >= c - 1 - s, the gradient's staleness being (c - 1) - v <= s
(0: it saw every earlier clock, as ps). With s = 0 every step is ps's step exactly. After its
push of step c, a worker waits for the server's reply for step c + 1: sent once rank 0 has entered
step c + 1 and V >= c - s, holding the parameters if V moved since that worker's last copy, else a
16-byte header ("keep yours"). Rank 0 waits likewise for V >= c - 1 - s before its own step c.
Messages are Isend/Irecv of NumPy buffers (async_ps's Flat: int64 version, float64 lr, float32
arrays; never pickled). `evaluated()` and `finish()` drain (every clock taken so far applied)
and broadcast the server's parameters.

Bytes per step, model of n float32 parameters: a rank r > 0 sends 16 + 4n ("ps_push") and
receives 16 + 4n or 16 ("ps_pull"); rank 0 receives (N-1)(16 + 4n) and sends at most as much.

Figures (rank 0): the staleness of every gradient applied: staleness_max (<= s, checked at every
application), staleness_mean, and the bound s itself; rank r > 0: wait_seconds for replies.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

import numpy as np

from d500.distributed.schemes.async_ps import HEADER, Flat
from d500.distributed.schemes.base import Option, Scheme, register

PUSH, PULL = 41, 42  # message tags


@register
class StaleSynchronousPS(Scheme):
    """Stale-synchronous parameter server at rank 0 with staleness <= s (module docstring)."""

    name = "ssp"
    options: ClassVar[dict[str, Option]] = {
        "staleness": Option(2, "whole", "most clocks a rank's parameters may miss (s)")}

    def __init__(self, trainer: Any, comm: Any, **kwargs: Any):
        super().__init__(trainer, comm, **kwargs)
        self.flat = Flat(trainer.parameters())
        self.wait_seconds = 0.0
        self.stale: list[int] = []  # rank 0: every applied gradient's staleness
        workers = range(1, self.size)
        self.version = 0  # rank 0: clocks applied; elsewhere: the version of the model held
        if self.rank == 0:
            self.sums: dict[int, tuple[dict[str, np.ndarray], int, float]] = {}
            self.pushed = dict.fromkeys(workers, 0)  # steps whose gradient arrived, per worker
            self.boxes = {w: self.flat.buffer() for w in workers}
            self.requests: dict[int, Any] = dict.fromkeys(workers)
            self.replies = {w: self.flat.buffer() for w in workers}
            self.replying: dict[int, Any] = dict.fromkeys(workers)
            self.held = dict.fromkeys(workers, 0)  # the version each worker holds
            self.owed: dict[int, int] = {}  # worker -> the step its next reply is for
        else:
            self.inbox, self.outbox = self.flat.buffer(), self.flat.buffer()
            self.sending: Any = None

    # ------------------------------------------------------------------ the interface
    def start(self) -> None:
        self.broadcast_parameters()
        if self.rank == 0:
            for w in self.boxes:
                self._post(w)

    def step(self, feeds: Mapping[str, np.ndarray], lr: float, weight: float = 1.0
             ) -> float:
        self.steps += 1
        c = self.steps
        if self.rank == 0:
            self._serve(until=lambda: self.version >= c - 1 - self.staleness)
            loss, grads = self.gradients(feeds, weight)
            self._add(c, grads, self.version, lr)
            self._serve(until=lambda: True)
            return loss
        if c > 1:
            self._pull()
        loss, grads = self.gradients(feeds, weight)
        if self.sending is not None:
            self.sending.Wait()
        self.flat.pack(self.outbox, grads, self.version, lr)
        self.sending = self.comm.mpi.Isend(self.outbox, dest=0, tag=PUSH)
        self._count("ps_push", sent=self.flat.nbytes)
        return loss

    def settle(self) -> None:
        """rank 0 applies every clock up to the step every rank has taken."""
        if self.rank == 0:
            self._serve(until=lambda: self.version == self.steps)

    @contextmanager
    def _evaluate(self) -> Iterator[None]:
        self._share()
        yield

    def _finish(self) -> None:
        self._share()
        if self.rank == 0:
            for r in self.requests.values():
                if r is not None:
                    r.Cancel()
                    r.Wait()
            for r in self.replying.values():
                if r is not None:
                    r.Wait()
        elif self.sending is not None:
            self.sending.Wait()
            self.sending = None

    def figures(self) -> dict[str, float]:
        out = {"wait_seconds": self.wait_seconds, "max_staleness": float(self.staleness)}
        if self.stale:
            s = np.asarray(self.stale)
            out.update(staleness_max=float(s.max()), staleness_mean=float(s.mean()),
                       gradients_applied=float(s.size))
        return out

    def details(self) -> dict[str, Any]:
        """rank 0: staleness_histogram[s] = how many applied gradients were s clocks behind."""
        return {"staleness_histogram": np.bincount(self.stale).tolist()} if self.stale else {}

    # ------------------------------------------------------------------ both sides
    def _share(self) -> None:
        """The server's parameters (every clock applied: settle ran) on every rank."""
        self.broadcast_parameters()
        if self.rank == 0:
            self.held = dict.fromkeys(self.held, self.version)
        else:
            self.version = self.steps

    def _count(self, name: str, sent: int = 0, received: int = 0, seconds: float = 0.0) -> None:
        from d500.distributed.comm import Traffic
        t = self.comm.traffic.setdefault(name, Traffic())
        t.calls += 1
        t.sent, t.received, t.seconds = t.sent + sent, t.received + received, t.seconds + seconds

    # ------------------------------------------------------------------ a worker (rank > 0)
    def _pull(self) -> None:
        """Wait for the server's reply for this step: parameters, or "keep yours"."""
        from mpi4py import MPI
        status = MPI.Status()
        start = time.perf_counter()
        self.comm.mpi.Recv(self.inbox, source=0, tag=PULL, status=status)
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
        elif version != self.version:
            raise RuntimeError(f"ssp: rank {self.rank} holds version {self.version}, rank 0 "
                               f"sent {version} without parameters")
        self.version = version

    # ------------------------------------------------------------------ the server (rank 0)
    def _post(self, w: int) -> None:
        self.requests[w] = self.comm.mpi.Irecv(self.boxes[w], source=w, tag=PUSH)

    def _add(self, step: int, grads: Mapping[str, np.ndarray], read: int, lr: float) -> None:
        """Step `step`'s gradient of one rank, computed on version `read`, into its clock's sum
        (rank 0's learning rate is the clock's)."""
        stale = step - 1 - read
        if stale > self.staleness:  # the invariant the waits keep
            raise RuntimeError(f"ssp: a gradient {stale} clocks stale (bound {self.staleness})")
        self.stale.append(stale)
        found = self.sums.get(step)
        if found is None:
            self.sums[step] = ({n: np.array(g, dtype=np.float32) for n, g in grads.items()}, 1,
                               lr)
            return
        total, count, rate = found
        for n, g in grads.items():
            total[n] += g
        self.sums[step] = (total, count + 1, rate)

    def _serve(self, until: Any) -> None:
        """Receive pushes, apply complete clocks and send the replies due until `until()`
        holds, blocking on the next push when nothing can be done."""
        while True:
            progress = self._receive(block=False)
            progress = self._apply_complete() or progress
            progress = self._reply() or progress
            if until():
                return
            if not progress:
                start = time.perf_counter()
                self._receive(block=True)
                self.wait_seconds += time.perf_counter() - start

    def _receive(self, block: bool) -> bool:
        if self.size == 1:
            return False
        from mpi4py import MPI
        workers = [w for w, r in self.requests.items() if r is not None]
        requests = [self.requests[w] for w in workers]
        done = [MPI.Request.Waitany(requests)] if block else (
            MPI.Request.Testsome(requests) or [])
        for i in done:
            w = workers[i]
            self.pushed[w] += 1
            read, lr = Flat.header(self.boxes[w])
            self._count("ps_push", received=self.flat.nbytes)
            self._add(self.pushed[w], self.flat.views(self.boxes[w]), read, lr)
            self.owed[w] = self.pushed[w] + 1
            self._post(w)
        return bool(done)

    def _apply_complete(self) -> bool:
        """Apply, in clock order, every clock whose gradients all arrived."""
        applied = False
        while (found := self.sums.get(self.version + 1)) is not None and found[1] == self.size:
            total, _, lr = self.sums.pop(self.version + 1)
            for g in total.values():
                g /= self.size
            self.trainer.apply(total, lr)
            self.version += 1
            applied = True
        return applied

    def _reply(self) -> bool:
        """Send each reply that is due: its step entered by rank 0 and V within s of it."""
        sent = False
        for w, step in list(self.owed.items()):
            if step > self.steps or self.version < step - 1 - self.staleness:
                continue
            del self.owed[w]
            if self.replying[w] is not None:
                self.replying[w].Wait()
            box = self.replies[w]
            if self.held[w] == self.version:
                box[:8].view(np.int64)[0] = self.version
                size = HEADER
            else:
                self.flat.pack(box, self.params.get(), self.version)
                size = self.flat.nbytes
            self.replying[w] = self.comm.mpi.Isend(box[:size], dest=w, tag=PULL)
            self.held[w] = self.version
            self._count("ps_pull", sent=size)
            sent = True
        return sent
