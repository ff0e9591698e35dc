"""Level 3's step figures are what a step costs: the scheme's settle() after each chunk of steps
(what the steps left in flight: a parameter server's drain of the workers' gradients) is charged
to them (d500.distributed.loop.RankLoop._settle). The attack, a scheme that takes its steps'
work out of step() and does it in settle(), on the loop of one real rank (sync on torch, the
digits-mlp rules): its step time and median step hold at least the time it worked in settle(),
its communication stays a part of them."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from d500.distributed import figures as figs
from d500.distributed import spec as specs
from d500.distributed import workloads
from d500.distributed.comm import Communicator
from d500.distributed.contention import Mark
from d500.distributed.loop import RankLoop
from d500.distributed.trainer import Job, build
from d500.training import submission
from d500.training.data import dataset as datasets
from tests.distributed.level3_jobs import ENTRIES, LEVEL3

STEPS = 12


class Deferred:
    """The sync scheme, each step's work put off to settle() (returning the last loss it had)."""

    def __init__(self, scheme: Any):
        self.scheme, self.owed, self.loss, self.worked = scheme, [], 0.0, 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.scheme, name)

    def step(self, feeds: dict[str, np.ndarray], lr: float, weight: float = 1.0) -> float:
        self.owed.append((feeds, lr, weight))
        return self.loss

    def settle(self) -> None:
        t = time.perf_counter()
        for owed in self.owed:
            self.loss = self.scheme.step(*owed)
        self.owed = []
        self.worked += time.perf_counter() - t


def _chunk(defer: bool) -> tuple[figs.RankStats, Any]:
    """STEPS steps of digits-mlp's first epoch on one rank through the loop, and its figures."""
    entry = submission.load(ENTRIES / "sync" / "submission.yaml")
    wl = workloads.load(LEVEL3 / "digits-mlp.yaml")
    job = Job(Communicator(), wl, entry, specs.parse(entry.distributed, entry.path), "torch")
    trainer, scheme, reducer = build(job, 0)
    scheme = Deferred(scheme) if defer else scheme
    loop = RankLoop(job, 0, trainer, scheme, reducer, None, None, None, Mark.now())
    scheme.start()
    parts, _ = datasets.parts(wl.dataset, None)
    loop.take(parts.train.x, parts.train.y, 100)
    loop._chunk(0, 0, STEPS, False, None)
    (stats,) = loop._gather()
    return stats, scheme


def test_a_scheme_working_in_settle_gets_no_faster_step():
    stats, scheme = _chunk(defer=True)
    assert stats.steps == STEPS and scheme.worked > 0 and not scheme.owed
    assert stats.step_seconds >= scheme.worked, (stats.step_seconds, scheme.worked)
    assert stats.step_median >= scheme.worked / STEPS, (stats.step_median, scheme.worked)
    assert figs.timed(stats)  # its collectives' seconds within the steps'
    got = figs.aggregate([stats])
    assert got["step_time"] >= scheme.worked / STEPS
    assert 0.0 <= got["comm_share"] <= 1.0

