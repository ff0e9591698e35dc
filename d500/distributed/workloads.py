"""Level-3 workload files (`levels/3-distributed/*.yaml`): a level-2 workload's fixed rules (model,
dataset and split, batch limits, cadence, validation target, budget) run at N ranks, plus:

    distributed:
      ranks: [1, 2, 4]        # the world sizes a run may use (mpiexec -n N); others are refused
      batch: global           # global: the entry's batch_size is the global batch, cut into N
                              #   shares (the level-2 batch limits apply to it: same convergence
                              #   rules at every N); per_rank: every rank takes batch_size, the
                              #   global batch is N * batch_size (the limits apply to the global)
      reference_ranks: 1      # scaling efficiency and speed-up are against this world size's
                              #   runs of the same entry (T_ref * ref / (N * T_N))

A level-3 workload has no `tuning:` (a file declaring one is refused): `d500 tune` tunes level 2,
and a level-3 entry is scored on its seed runs at each world size.

The global batch size is what the MLLOG and the ledger record (`batch_size`); the per-rank share
beside it. The stop rule still reads validation accuracy only: a run that scales by giving up
accuracy misses its target like any level-2 run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from d500 import workload as _workload
from d500.errors import ConfigError
from d500.training import workloads as level2
from d500.workload import Field

# What a level-3 run measures on top of level 2's.
MEASURED = (*level2.MEASURED, "bytes_per_step", "bytes_received_per_step", "step_time",
            "comm_time", "compute_time", "comm_share", "compression_ratio",
            "scaling_efficiency", "speedup", "memory_per_rank", "staleness_max")
BATCH_MODES = ("global", "per_rank")
DISTRIBUTED = {
    "ranks": Field(list, required=True, items=int, help="allowed world sizes"),
    "batch": Field(str, default="global", choices=BATCH_MODES),
    "reference_ranks": Field(int, default=1, help="the world size scaling is measured against"),
}
# Level 2's fields but `tuning` (level 3 is not tuned), its own `level`, plus `distributed`.
SCHEMA = {**{k: v for k, v in level2.SCHEMA.items() if k != "tuning"},
          "level": _workload.level_field(3), "distributed": Field(DISTRIBUTED, required=True)}


def refuse_tuning(data: Mapping[str, Any], where: str | Path) -> None:
    """A ConfigError naming the file when a level-3 workload's fields declare `tuning:`."""
    if "tuning" in data:
        raise ConfigError(f"{where}: field 'tuning' is not allowed at level 3 (`d500 tune` "
                          f"tunes level-2 workloads; level 3 is scored on seed runs at each "
                          f"world size)")


@dataclass
class DistributedWorkload(level2.Workload):
    """A validated level-3 workload: a level-2 Workload plus its world sizes and batch rule."""

    ranks: tuple[int, ...] = ()
    batch_mode: str = "global"
    reference_ranks: int = 1

    def global_batch(self, batch_size: int, world: int) -> int:
        """The global batch of an entry choosing `batch_size` at `world` ranks."""
        return batch_size if self.batch_mode == "global" else batch_size * world

    def check_world(self, world: int) -> None:
        """A ConfigError unless the workload allows `world` ranks."""
        if world not in self.ranks:
            allowed = ", ".join(map(str, self.ranks))
            raise ConfigError(f"{self.path}: workload '{self.name}' runs at {allowed} rank(s) "
                              f"(field 'distributed.ranks'), not at {world}")

    def check_batch(self, batch_size: int, world: int, where: str) -> None:
        """The global batch is within the limits and can be shared by `world` ranks."""
        total = self.global_batch(batch_size, world)
        if not self.batch_min <= total <= self.batch_max:
            raise ConfigError(f"{where}: the global batch {total} (batch_size {batch_size}, "
                              f"{self.batch_mode} at {world} ranks) is outside the limits of "
                              f"workload '{self.name}' ({self.batch_min} to {self.batch_max})")
        if total < world:
            raise ConfigError(f"{where}: the global batch {total} is smaller than the {world} "
                              f"ranks sharing it")


def load(path: str | Path, text: str | bytes | None = None) -> DistributedWorkload:
    """Read and check a level-3 workload (`text`: the file's content, read from elsewhere);
    every problem is a ConfigError naming the field."""
    path = Path(path)
    try:
        data = _workload.load(path, SCHEMA, text=text)
    except ConfigError:
        raw = _workload.read_yaml(path, text)[1]
        if isinstance(raw, Mapping) and raw.get("level") == 3:
            refuse_tuning(raw, path)  # what the schema's "unknown field 'tuning'" means here
        raise
    dist = data.pop("distributed")
    base = level2.from_data(path, data, MEASURED)
    ranks = dist["ranks"]
    if not ranks or any(n < 1 for n in ranks):
        raise ConfigError(f"{path}: field 'distributed.ranks' must list world sizes >= 1")
    if len(set(ranks)) != len(ranks):
        raise ConfigError(f"{path}: field 'distributed.ranks' lists a world size twice")
    if dist["reference_ranks"] < 1:
        raise ConfigError(f"{path}: field 'distributed.reference_ranks' must be at least 1")
    return DistributedWorkload(**vars(base), ranks=tuple(sorted(ranks)), batch_mode=dist["batch"],
                               reference_ranks=dist["reference_ranks"])
