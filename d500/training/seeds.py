"""The seeds the rules choose (never the sender): a result's required seed runs, derived from the
workload, the entry, the backend (and, at level 3, the world size), and which recorded runs score.

    required(2, "digits-mlp", "sgd-momentum", "torch", 3)     # the 3 seeds that score, in order
    count(workload_text, workload_file)                       # the workload's `seeds:` (None: bad)
    tuning_trials(workload_text, workload_file)               # its `tuning: trials` (None: none)
    scored, explorations = split(seed_runs)                   # ledger rows of one result

Only the required seeds score. A seed run with any other seed (`d500 train --seed S`) is an
exploration: listed, never scored. A required seed whose only runs were interrupted counts as a
miss (∞) until it is re-run to completion; a run still running counts for nothing yet.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from d500.training.tuning import DONE as ENDED  # a seed run's final statuses (it counts)
from d500.training.tuning import seed_of


def required(level: int, workload: str, entry: str, backend: str, n: int, world: int = 1
             ) -> list[int]:
    """The n seeds of a result, seed_of("seed", workload, entry, backend[, world], i), i < n
    (level 3 keys by world size: each N a result of its own)."""
    at = (f"x{int(world or 1)}",) if level == 3 else ()
    return [seed_of("seed", workload, entry, backend, *at, i) for i in range(n)]


def count(text: str | None, path: str | None = None) -> int | None:
    """The number of seed runs a recorded workload text requires (the schema's default when
    absent); None when there is no text or it cannot be read."""
    return _rules(text, path or "workload.yaml")[0] if text is not None else None


def tuning_trials(text: str | None, path: str | None = None) -> int | None:
    """The trials per study a recorded workload text asks for (None: no tuning, or no rules)."""
    return _rules(text, path or "workload.yaml")[1] if text is not None else None


@functools.lru_cache(maxsize=256)
def _rules(text: str, path: str) -> tuple[int | None, int | None]:
    """(seeds, trials per study) of a workload text, as its level's loader reads them; a text
    the loader refuses (a rules file of another version, a test's sketch) by its own `seeds:`
    and `tuning:` fields, the level-2 schema's defaults when absent."""
    from d500.distributed import workloads as level3
    from d500.errors import D500Error
    from d500.training import workloads as level2
    from d500.workload import mapping
    try:
        raw = mapping(text.encode(), path)
    except D500Error:
        return None, None
    try:
        loaded = (level3.load if raw.get("level") == 3 else level2.load)(path, text=text)
        return loaded.seeds, (loaded.trials if loaded.tuned else None)
    except D500Error:
        pass
    seeds = raw.get("seeds", level2.SCHEMA["seeds"].default)
    tuning = raw.get("tuning", level2.SCHEMA["tuning"].default)
    trials = tuning.get("trials", level2.SCHEMA["tuning"].default["trials"]) \
        if isinstance(tuning, dict) and raw.get("level") != 3 else None
    return (seeds if _positive(seeds) else None), (trials if _positive(trials) else None)


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def required_of(run: dict[str, Any]) -> list[int]:
    """The required seeds of the result a ledger row belongs to (its recorded rules; [] when
    they cannot be read)."""
    n = count(run.get("workload_text"), run.get("workload_file"))
    if not n:
        return []
    return required(run.get("level") or 2, run.get("workload") or "",
                    run.get("submission") or "", run.get("backend") or "", n,
                    run.get("world_size") or 1)


def split(runs: Iterable[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Seed runs (outside any study) split into those that score and the explorations: per
    required seed its ended runs, else its last interrupted one (a miss); running runs of a
    required seed are neither."""
    scored: list[dict[str, Any]] = []
    explorations: list[dict[str, Any]] = []
    by_seed: dict[Any, list[dict[str, Any]]] = {}
    for r in runs:
        if r.get("seed") in required_of(r):
            by_seed.setdefault(r.get("seed"), []).append(r)
        else:
            explorations.append(r)
    for same in by_seed.values():
        ended = [r for r in same if r["status"] in ENDED]
        cut = [r for r in same if r["status"] == "interrupted"]
        scored += ended or cut[-1:]
    scored.sort(key=lambda r: r.get("id") or 0)
    return scored, explorations
