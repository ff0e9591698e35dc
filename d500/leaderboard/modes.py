"""Each framework at its best: per workload, the mode of each framework (torch or torch:compiled,
tensorflow or tensorflow:xla, ...) whose row ranks best, with the mode named, every mode's figure
beside it and what compiling cost, from the boards (the ledger) only.

A framework's rows are compared only within one machine and one thread count (a row's identity),
and a row timed on a loaded machine is never its framework's best while a clean one exists; when
every row is loaded, the best is shown with that mark. `compile_time` is the median of the figure
its runs recorded (level 1: part of first_call_time, never of latency; level 2: inside time to
accuracy); a run that found its program in a warm compile cache is counted under "warm cache".
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from d500.backends import split
from d500.levels import View

TITLE = "each framework at its best mode"


def view(boards: Sequence[Any]) -> View | None:
    """The best mode of every framework on each workload's newest board; None when no board
    holds a framework in more than one mode or a ranked figure."""
    rows, seen = [], set()
    for board in boards:  # the newest rules version of each workload first
        if board.workload in seen or board.rank_by is None:
            continue
        seen.add(board.workload)
        groups: dict[tuple, list[Any]] = {}
        for e in board.entries:
            if e.aggregate.get(board.rank_by.name) is not None:
                entry = "" if e.submission == e.backend else e.submission  # level 1: the same
                precision = getattr(e, "precision", "fp32")  # (a row's, where boards keep it)
                key = (split(e.backend)[0], entry, e.machine, e.threads, precision)
                groups.setdefault(key, []).append(e)
        for (fw, submission, *_), entries in sorted(groups.items(), key=lambda kv: kv[0][:2]):
            rows.append(_row(board, fw, submission, entries))
    if not rows or not any(r[-1] for r in rows):  # no framework ran in two modes
        return None
    headers = ["workload", "framework", "submission", "best mode", "figure",
               "its compile_time", "every mode"]
    notes = ["best mode: the framework's row (mode, thread count) with the best ranked figure "
             "on that machine; rows timed on a loaded machine never win beside a clean one "
             "(⚠ loaded: every row was)",
             "compile: median compile_time over the mode's runs; level 1: part of "
             "first_call_time, never of latency; level 2: inside time_to_accuracy (the compile "
             "runs on the clock)",
             "warm cache: runs that found their program already compiled in the cache under "
             "D500_HOME (an earlier run's work: their compile and time to accuracy are smaller "
             "than a cold start's)"]
    return View(f"{TITLE} (fastest mode per framework, from the ledger)", headers,
                [r[:-1] for r in rows], [], notes)


def _row(board: Any, fw: str, submission: str, entries: list[Any]) -> list[Any]:
    metric = board.rank_by
    every = sorted(entries, key=lambda e: (e.loaded, metric.sort_key(e.aggregate[metric.name])))
    best = every[0]  # a clean row first: a loaded one only when every row is
    mark = " ⚠ loaded" if best.loaded else ""
    shown = ", ".join(f"{e.label} {metric.format(e.aggregate[metric.name])}"
                      f"{' (loaded)' if e.loaded else ''}{_compiling(e)}" for e in every)
    modes = {e.backend for e in entries}
    return [board.workload, fw, submission or "", best.label + mark,
            metric.format(best.aggregate[metric.name]), _compiling(best).strip(" ()") or "—",
            shown, len(modes) > 1]


def _compiling(entry: Any) -> str:
    """" (compile 9.4 s, 2 / 3 warm)" for a row whose runs recorded compile_time, else ""."""
    compiles = [r["figures"]["compile_time"] for r in entry.runs
                if isinstance((r.get("figures") or {}).get("compile_time"), (int, float))]
    if not compiles:
        return ""
    warm = sum(1 for r in entry.runs if _warm(r))
    return (f" (compile {_seconds(statistics.median(compiles))}, "
            f"{warm} / {len(compiles)} warm cache)")


def _warm(run: dict[str, Any]) -> bool:
    from d500.training.compiling import warm
    return warm(run)


def _seconds(value: float) -> str:
    from d500.metrics import format_duration
    return format_duration(value)
