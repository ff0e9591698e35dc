"""A rank's own CPU time over a level-3 run, as the rank reports it (a figure beside the run's;
the judge measures the ranks' CPU on its host itself for the load record: judge.job_root).

    mark = Mark.now()                 # every rank, at the start
    ...                               # the run
    used = mark.own_cpu()             # every rank: its own CPU seconds since, gathered to rank 0
"""

from __future__ import annotations

import dataclasses
import os


def process_cpu() -> float:
    """This process's CPU seconds (every thread, user and system)."""
    t = os.times()
    return t.user + t.system


@dataclasses.dataclass
class Mark:
    """A run's start: this process's CPU time."""

    cpu: float

    @classmethod
    def now(cls) -> Mark:
        return cls(process_cpu())

    def own_cpu(self) -> float:
        """This process's CPU seconds since the mark."""
        return process_cpu() - self.cpu
