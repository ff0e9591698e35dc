"""The seeds the rules choose (never the sender): a result's required seed runs, derived from the
workload, the entry, the backend (and, at level 3, the world size), and which recorded runs score.

    required(2, "digits-mlp", "sgd-momentum", "torch", 3)     # the 3 seeds to run, in order
    count(workload_text, workload_file)                       # M: `seed_runs:` else `seeds:`
    scoring(workload_text, workload_file)                     # N: its `seeds:` (None: bad)
    tuning_trials(workload_text, workload_file)               # its `tuning: trials` (None: none)
    scored, explorations = split(seed_runs)                   # ledger rows of one result

Only the required seeds score. A seed run with any other seed (`d500 train --seed S`) is an
exploration: listed, never scored. A required seed whose only runs were interrupted counts as a
miss (∞) until it is re-run to completion; a run still running counts for nothing yet. A workload
with `seed_runs: M` (> its `seeds: N`) requires M seeds, of which the N consecutive in the rules'
seed order (seed i < M, fixed before any run) closest to their median score
(d500.training.window); the other M − N are listed as run, unscored. The order is never the
sender's: not the start times (a re-dated start and MLLOG would reorder runs that started close
together), not the ledger ids (a re-sealed ledger can renumber them), not the order the sender
chose to launch the seeds in (`--seed`, one at a time, after seeing the first ones' times).

The required seeds are known before any run (they follow from the entry's name, which the sender
picks), so a sender can scout names. Where the organiser has re-run a result at seeds drawn after
the package was committed (`d500 reproduce --fresh-seeds N`, recorded in the organiser's own
ledger), those runs score instead (`sort_out(rows, own_draws=True)`, `drawn`): one per drawn seed,
in draw order, and the sender's required seeds of that result are listed, not scored
(d500.leaderboard.ranking, d500.training.score, d500.distributed.views).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from d500.training.tuning import DONE as ENDED  # a seed run's final statuses (it counts)
from d500.training.tuning import seed_of
from d500.training.window import Choice, choose


def required(level: int, workload: str, entry: str, backend: str, n: int, world: int = 1
             ) -> list[int]:
    """The n seeds of a result, seed_of("seed", workload, entry, backend[, world], i), i < n
    (level 3 keys by world size: each N a result of its own)."""
    at = (f"x{int(world or 1)}",) if level == 3 else ()
    return [seed_of("seed", workload, entry, backend, *at, i) for i in range(n)]


def count(text: str | None, path: str | None = None) -> int | None:
    """The number of seed runs a recorded workload text requires, M (its `seed_runs:`, else its
    `seeds:`, else the schema's default); None when there is no text or it cannot be read."""
    return _rules(text, path or "workload.yaml")[2] if text is not None else None


def scoring(text: str | None, path: str | None = None) -> int | None:
    """The number of seed runs that score, N (the workload's `seeds:`); None: unreadable."""
    return _rules(text, path or "workload.yaml")[0] if text is not None else None


def tuning_trials(text: str | None, path: str | None = None) -> int | None:
    """The trials per study a recorded workload text asks for (None: no tuning, or no rules)."""
    return _rules(text, path or "workload.yaml")[1] if text is not None else None


@functools.lru_cache(maxsize=256)
def _rules(text: str, path: str) -> tuple[int | None, int | None, int | None]:
    """(seeds, trials per study, seed runs) of a workload text, as its level's loader reads
    them; a text the loader refuses (a rules file of another version, a test's sketch) by its
    own `seeds:`, `tuning:` and `seed_runs:` fields, the level-2 schema's defaults when absent."""
    from d500.distributed import workloads as level3
    from d500.errors import D500Error
    from d500.training import workloads as level2
    from d500.workload import mapping
    try:
        raw = mapping(text.encode(), path)
    except D500Error:
        return None, None, None
    try:
        loaded = (level3.load if raw.get("level") == 3 else level2.load)(path, text=text)
        return loaded.seeds, (loaded.trials if loaded.tuned else None), loaded.seed_runs
    except D500Error:
        pass
    seeds = raw.get("seeds", level2.SCHEMA["seeds"].default)
    tuning = raw.get("tuning", level2.SCHEMA["tuning"].default)
    trials = tuning.get("trials", level2.SCHEMA["tuning"].default["trials"]) \
        if isinstance(tuning, dict) and raw.get("level") != 3 else None
    seeds = seeds if _positive(seeds) else None
    runs = raw.get("seed_runs", seeds)
    runs = runs if _positive(runs) and seeds and runs >= seeds else seeds
    return seeds, (trials if _positive(trials) else None), runs


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


@dataclass
class Sorted:
    """A result's seed runs sorted out: those that score, those run and not scored (the M − N
    outside the window), the explorations, and the window's Choice (None when M = N)."""

    scored: list[dict[str, Any]] = field(default_factory=list)
    unscored: list[dict[str, Any]] = field(default_factory=list)
    explorations: list[dict[str, Any]] = field(default_factory=list)
    choice: Choice | None = None


def split(runs: Iterable[dict[str, Any]], own_draws: bool = False
          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the runs that score, the explorations) of sort_out."""
    out = sort_out(runs, own_draws)
    return out.scored, out.explorations


def drawn(run: dict[str, Any]) -> bool:
    """Whether a ledger row is one of its own ledger's fresh-seed reproductions (`d500 reproduce
    --fresh-seeds`: the seed drawn by the ledger's owner after the package was committed). An
    imported row never is, whatever its details say (its package's sender wrote them)."""
    rep = (run.get("details") or {}).get("reproduction")
    return (not run.get("source") and not run.get("package") and isinstance(rep, dict)
            and run.get("seed") is not None and rep.get("fresh_seed") == run.get("seed"))


def drawn_scored(runs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fresh-seed reproductions that score, one per drawn seed: its first ended run, else
    its last interrupted one (a miss); in the order the ledger recorded them."""
    by_seed: dict[Any, list[dict[str, Any]]] = {}
    for r in sorted(runs, key=lambda r: r.get("id") or 0):
        by_seed.setdefault(r.get("seed"), []).append(r)
    out = []
    for same in by_seed.values():
        ended = [r for r in same if r["status"] in ENDED]
        cut = [r for r in same if r["status"] == "interrupted"]
        out += ended[:1] or cut[-1:]
    return sorted(out, key=lambda r: r.get("id") or 0)


def sort_out(runs: Iterable[dict[str, Any]], own_draws: bool = False) -> Sorted:
    """Seed runs (outside any study) of one result sorted out: per required seed its ended runs,
    else its last interrupted one (a miss); running runs of a required seed are neither; other
    seeds are explorations. With M > N required, the window of N (d500.training.window) scores.
    With `own_draws` (rows of a ledger, not a package under check), the ledger's own fresh-seed
    reproductions (`drawn`) score, one per drawn seed, and no window applies to them."""
    counted: list[dict[str, Any]] = []
    explorations: list[dict[str, Any]] = []
    by_seed: dict[Any, list[dict[str, Any]]] = {}
    runs = list(runs)
    if own_draws and any(drawn(r) for r in runs):
        fresh = [r for r in runs if drawn(r)]
        scored = drawn_scored(fresh)
        kept = {id(r) for r in scored}  # a drawn seed's other runs: run, not scored
        return Sorted(scored, [r for r in fresh if id(r) not in kept],
                      [r for r in runs if not drawn(r)])
    for r in runs:
        if r.get("seed") in required_of(r):
            by_seed.setdefault(r.get("seed"), []).append(r)
        else:
            explorations.append(r)
    for same in by_seed.values():
        ended = [r for r in same if r["status"] in ENDED]
        cut = [r for r in same if r["status"] == "interrupted"]
        counted += ended or cut[-1:]
    counted.sort(key=lambda r: r.get("id") or 0)
    if not counted:
        return Sorted(explorations=explorations)
    m = count(counted[0].get("workload_text"), counted[0].get("workload_file")) or 0
    n = scoring(counted[0].get("workload_text"), counted[0].get("workload_file")) or m
    if m <= n:
        return Sorted(counted, [], explorations)
    from d500.training.score import time_to_target
    ordered = sorted(counted, key=position)
    choice = choose([time_to_target(r) for r in ordered], n, m)
    kept = [r for i, r in enumerate(ordered) if choice.picks(i)]
    rest = [r for i, r in enumerate(ordered) if not choice.picks(i)]
    return Sorted(sorted(kept, key=lambda r: r.get("id") or 0), rest, explorations, choice)


def position(run: dict[str, Any]) -> int:
    """A required seed run's place in the window's order: its seed's index i in the rules' list
    (seed_of(..., i)). Nothing the sender records moves it: one run counts per seed."""
    return required_of(run).index(run.get("seed"))
