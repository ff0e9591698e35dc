"""How much of this machine other processes used while a level-3 run trained: the CPU time every
core spent busy (Linux /proc/stat) less the CPU time of the job's own ranks on this host, over the
run's wall time, in cores. A 1-minute load average lags too much for a run of a few seconds, and
MPI ranks that poll while they wait keep every core busy, so any other process takes time from
the job; this says how much.

    mark = Mark.now()                 # every rank, at the start (rank 0: the machine too)
    ...                               # the run
    used = mark.own_cpu()             # every rank: its own CPU seconds since, gathered to rank 0
    record = mark.others(sum_of_the_ranks_cpu_on_this_host)   # rank 0
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any


def process_cpu() -> float:
    """This process's CPU seconds (every thread, user and system)."""
    t = os.times()
    return t.user + t.system


@dataclasses.dataclass
class Mark:
    """A run's start: wall clock, this process's CPU time, the machine's busy time."""

    wall: float
    cpu: float
    busy: float | None

    @classmethod
    def now(cls) -> Mark:
        from d500.provenance import busy_seconds
        return cls(time.monotonic(), process_cpu(), busy_seconds())

    def own_cpu(self) -> float:
        """This process's CPU seconds since the mark."""
        return process_cpu() - self.cpu

    def others(self, job_cpu: float) -> dict[str, Any]:
        """{"others_cores": cores' worth of CPU other processes used on this host since the mark,
        "cores", "loaded"} given the CPU seconds of this job's ranks on this host."""
        from d500.provenance import busy_seconds, loaded_share, usable_cores
        cores = usable_cores()
        end = busy_seconds()
        wall = max(time.monotonic() - self.wall, 1e-6)
        if self.busy is None or end is None:
            return {"others_cores": None, "cores": cores, "loaded": None}
        others = max(0.0, (end - self.busy - job_cpu) / wall)
        return {"others_cores": round(others, 3), "cores": cores,
                "loaded": others > loaded_share() * cores}
