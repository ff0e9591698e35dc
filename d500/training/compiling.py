"""What a compiling mode's training run records (torch:compiled): its compile time and whether it
found the compile cache warm.

Compile time counts in time to accuracy: the worker compiles its step on the first step, after
the clock started, and nothing it compiles before the clock can be hidden. MLPerf Training would
let up to 30 minutes of model initialisation, compilation included, run before the clock when
it touches no data (training_rules.adoc, "Run Results"); d500 is stricter, since its workloads
train in seconds while a compile takes 10-130 s. `compile_time` is recorded apart as well, as the
worker said it (a figure the supervisor cannot time, never ranked). A compile that found its
program in the cache under $D500_HOME, compiled by an earlier run, is faster: such a run is
marked `warm`, by the worker's word or by the supervisor's own look at the cache when its clock
started (which also catches a program compiled in the worker before the clock).
"""

from __future__ import annotations

import math
from typing import Any

DETAIL = "compile"  # the run detail: {"cache": "warm" | "cold", "programs": [...], ...}


def cached_programs(backend_cls: Any) -> set[str] | None:
    """The programs the backend's compile cache holds now (None: the mode does not compile)."""
    return backend_cls.compiled_programs()


def record(run: Any, said: Any, before: set[str] | None) -> dict[str, float]:
    """Record the worker's compile record `said` (CompiledTrainer.compile_record) on `run`,
    checked; `before`: the cache's programs at the clock's start. Returns the figure."""
    if not isinstance(said, dict):
        return {}
    seconds = said.get("compile_time")
    keys = [k for k in said.get("keys", []) if isinstance(k, str)]
    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds < 0:
        return {}
    cached = sorted(set(keys) & (before or set()))
    warm = said.get("cache") == "warm" or bool(cached)
    run.record(details={DETAIL: {"cache": "warm" if warm else "cold", "programs": keys,
                                 "in_cache_at_clock_start": cached,
                                 "counts_in_time_to_accuracy": True}})
    return {"compile_time": float(seconds)}


def warm(run: dict[str, Any]) -> bool:
    """Whether a ledger run compiled with a warm cache."""
    return ((run.get("details") or {}).get(DETAIL) or {}).get("cache") == "warm"
