"""The stale-synchronous parameter server (Ho et al., NIPS'13: SSP), between ps and async_ps: the
update of clock c is, as ps's, the average of every rank's gradient of step c, applied in clock
order; but a rank may compute step c on parameters that miss the last s clocks (bounded staleness
s), so it waits for the server only when it is more than s clocks ahead of the slowest rank.

Rank 0 is server and worker (as in async_ps; the messages and buffers are server.py's). Version V =
clocks applied. A rank computes step c on parameters of some version v >= c - 1 - s, the gradient's
staleness being (c - 1) - v <= s (0: it saw every earlier clock, as ps). With s = 0 every step is
ps's step exactly. After its push of step c, a worker waits for the server's reply for step c + 1:
sent once rank 0 has entered step c + 1 and V >= c - s, holding the parameters if V moved since that
worker's last copy, else a 16-byte header ("keep yours"). Rank 0 waits likewise for V >= c - 1 - s
before its own step c. `evaluated()` and `finish()` drain (every clock taken so far applied) and
broadcast the server's parameters.

Bytes per step, model of n float32 parameters: a rank r > 0 sends 16 + 4n ("ps_push") and
receives 16 + 4n or 16 ("ps_pull"); rank 0 receives (N-1)(16 + 4n) and sends at most as much.

Figures (rank 0): the staleness of every gradient applied: staleness_max (<= s, checked at every
application), staleness_mean, and the bound s itself; rank r > 0: wait_seconds for replies.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

import numpy as np

from d500.distributed.schemes.base import Option, register
from d500.distributed.schemes.server import Flat, Served


@register
class StaleSynchronousPS(Served):
    """Stale-synchronous parameter server at rank 0 with staleness <= s (module docstring)."""

    name = "ssp"
    PUSH, PULL = 41, 42  # message tags
    options: ClassVar[dict[str, Option]] = {
        "staleness": Option(2, "whole", "most clocks a rank's parameters may miss (s)")}

    def __init__(self, trainer: Any, comm: Any, **kwargs: Any):
        super().__init__(trainer, comm, **kwargs)
        self.stale: list[int] = []  # rank 0: every applied gradient's staleness
        workers = range(1, self.size)
        self.version = 0  # rank 0: clocks applied; elsewhere: the version of the model held
        if self.rank == 0:
            self.sums: dict[int, tuple[dict[str, np.ndarray], int, float]] = {}
            self.pushed = dict.fromkeys(workers, 0)  # steps whose gradient arrived, per worker
            self.held = dict.fromkeys(workers, 0)  # the version each worker holds
            self.owed: dict[int, int] = {}  # worker -> the step its next reply is for

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
        if c > 1:  # the reply for this step: parameters, or "keep yours"
            self.version = self._pull(self.version)
        loss, grads = self.gradients(feeds, weight)
        self._push(grads, self.version, lr)
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
        self._close()

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

    # ------------------------------------------------------------------ the server (rank 0)
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

    def _receive(self, block: bool) -> bool:
        """Pushes that have arrived (block: wait for one) into their clocks' sums; each makes
        a reply owed to its worker."""
        done = self._arrivals([w for w, r in self.requests.items() if r is not None], block)
        for w in done:
            self.pushed[w] += 1
            read, lr = Flat.header(self.boxes[w])
            self._add(self.pushed[w], self.flat.views(self.boxes[w]), read, lr)
            self.owed[w] = self.pushed[w] + 1
            self._post(w)
        return bool(done)

    def _apply_ready(self) -> bool:
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

    def _hand_out(self) -> bool:
        """Send each reply that is due: its step entered by rank 0 and V within s of it."""
        sent = False
        for w, step in list(self.owed.items()):
            if step > self.steps or self.version < step - 1 - self.staleness:
                continue
            del self.owed[w]
            self._send(w, self.version, held=self.held[w] == self.version)
            self.held[w] = self.version
            sent = True
        return sent
