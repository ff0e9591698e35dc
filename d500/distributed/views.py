"""Level 3's sections of the leaderboard, from the ledger alone: per workload and world size every
(entry, backend) with its scheme and compressor, time to accuracy (median over its runs, a miss
counting as infinity), test accuracy, bytes per step, communication share, scaling efficiency
against its own runs at the reference world size, and the ratio of its time to the DDP baseline's;
then time to accuracy against ranks per entry (a plot per workload)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from d500 import metrics
from d500.levels import View

NATIVE = "ddp"


@dataclass
class Row:
    """One (workload, world size, submission, backend): its runs and their medians."""

    workload: str
    ranks: int
    submission: str
    backend: str
    scheme: str = "?"
    compressor: str = "none"
    runs: list[dict[str, Any]] = field(default_factory=list)
    oversubscribed: bool = False
    contended: bool = False  # other processes took a share of the machine during a run

    def median(self, name: str, missing: float | None = None) -> float | None:
        """Median of a figure over the counted runs (a miss counts as `missing` if given)."""
        values = []
        for r in self.runs:
            v = r["figures"].get(name) if r["status"] == "succeeded" else None
            if v is None:
                v = missing
            if v is not None and not math.isnan(v):
                values.append(float(v))
        return statistics.median(values) if values else None

    @property
    def time(self) -> float | None:
        return self.median("time_to_accuracy", math.inf)


def rows(level: int, boards: Sequence[Any], ledger: Any) -> list[Row]:
    """The rows of the boards' workloads (their rules versions), counted runs only."""
    wanted = {(b.workload, b.workload_sha256) for b in boards}
    found: dict[tuple[str, int, str, str], Row] = {}
    for r in ledger.runs(level=level):
        if (r["workload"], r["workload_sha256"]) not in wanted or r["study"] is not None \
                or r["status"] in ("running", "interrupted"):
            continue
        key = (r["workload"], r["world_size"] or 1, r["submission"] or "", r["backend"] or "")
        row = found.setdefault(key, Row(*key))
        h = r["hyperparameters"] or {}
        row.scheme, row.compressor = h.get("scheme", row.scheme), h.get("compressor", "none")
        row.oversubscribed |= bool((r["details"] or {}).get("oversubscribed"))
        row.contended |= bool(((r["details"] or {}).get("contention") or {}).get("loaded"))
        row.runs.append(r)
    return sorted(found.values(), key=lambda x: (x.workload, x.ranks, _key(x.time),
                                                 x.submission, x.backend))


def _key(value: float | None) -> float:
    return math.inf if value is None else value


def efficiency(row: Row, every: list[Row], reference: int = 1) -> tuple[float | None, ...]:
    """(scaling efficiency, speed-up) of a row against the same entry's rows at the reference
    world size, from the medians (None without a reference or a finite time)."""
    ref = next((x for x in every if (x.workload, x.submission, x.backend, x.ranks) ==
                (row.workload, row.submission, row.backend, reference)), None)
    t, t_ref = row.time, ref.time if ref is not None else None
    if t is None or t_ref is None or not (math.isfinite(t) and math.isfinite(t_ref)) or t <= 0:
        return None, None
    return reference * t_ref / (row.ranks * t), t_ref / t


def views(level: int, boards: Sequence[Any], ledger: Any) -> list[View]:
    every = rows(level, boards, ledger)
    if not every:
        return []
    refs = {b.workload: _reference(b, ledger) for b in boards}
    return [v for v in (table_view(every, refs), plot_view(every)) if v is not None]


def _reference(board: Any, ledger: Any) -> int:
    """The workload's reference world size, from the rules recorded with its runs (default 1)."""
    import yaml
    for r in ledger.runs(level=board.level, workload=board.workload):
        if r["workload_sha256"] == board.workload_sha256 and r["workload_text"]:
            data = yaml.safe_load(r["workload_text"]) or {}
            return int((data.get("distributed") or {}).get("reference_ranks", 1))
    return 1


def _fmt(name: str, value: float | None) -> str:
    return metrics.get(name).format(value)


def table_view(every: list[Row], refs: dict[str, int]) -> View:
    out = []
    notes = []
    marks = {"*": False, "†": False}
    for row in every:
        eff, speed = efficiency(row, every, refs.get(row.workload, 1))
        ddp = next((x for x in every if (x.workload, x.ranks, x.backend) ==
                    (row.workload, row.ranks, row.backend) and x.scheme == NATIVE), None)
        ratio = "—"
        if ddp is not None and row.time is not None and ddp.time is not None:
            both = math.isfinite(row.time) and math.isfinite(ddp.time) and ddp.time > 0
            ratio = f"{row.time / ddp.time:.2f}" if both else "∞" if math.isinf(row.time) \
                else "—"
        counts = f"{sum(r['status'] == 'succeeded' for r in row.runs)}/{len(row.runs)}"
        ranks = f"{row.ranks}" + (" *" if row.oversubscribed else "") + \
            (" †" if row.contended else "")
        marks["*"] |= row.oversubscribed
        marks["†"] |= row.contended
        out.append([row.workload, ranks, row.submission, row.scheme, row.compressor,
                    row.backend, _fmt("time_to_accuracy", row.time),
                    _fmt("test_accuracy", row.median("test_accuracy")),
                    _fmt("bytes_per_step", row.median("bytes_per_step")),
                    _fmt("comm_share", row.median("comm_share")),
                    _fmt("scaling_efficiency", eff), _fmt("speedup", speed), ratio, counts])
    if marks["*"]:
        notes.append("* more ranks than the machine has cores (oversubscribed): times at this "
                     "world size measure contention as much as scaling")
    if marks["†"]:
        notes.append("† other processes took more than a tenth of the machine's CPU during a run "
                     "of this row (its details: contention): its times are not comparable")
    notes.append("time to accuracy and the other figures: median over the entry's runs at that "
                 "world size (a missed target counts as ∞); scaling efficiency = ref·T_ref / "
                 "(N·T_N) against the same entry at the workload's reference world size; vs DDP = "
                 "T_N / T_N of the ddp baseline at the same world size and backend; comm share "
                 "is not measured for DDP (it overlaps communication with the backward pass)")
    return View("distributed: every entry per workload and world size",
                ["workload", "ranks", "submission", "scheme", "compressor", "backend",
                 "time to accuracy", "test acc", "bytes/step", "comm share", "scaling eff",
                 "speed-up", "vs DDP", "ok/runs"], out, notes=notes)


def plot_view(every: list[Row]) -> View | None:
    """Time to accuracy against ranks, one line per (entry, backend), a plot per workload."""
    from d500.leaderboard.plots import figure, png
    plots = []
    for workload in sorted({r.workload for r in every}):
        fig = figure(7, 3.5)
        ax = fig.add_subplot()
        drawn = 0
        mine = [r for r in every if r.workload == workload]
        for i, label in enumerate(dict.fromkeys((r.submission, r.backend) for r in mine)):
            points = sorted((r.ranks, r.time) for r in mine if (r.submission, r.backend) == label
                            and r.time is not None and math.isfinite(r.time))
            if points:
                ax.plot(*zip(*points), marker="o", color=f"C{i % 10}",
                        label=f"{label[0]} / {label[1]}")
                drawn += 1
        if not drawn:
            continue
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks")
        ax.set_ylabel("time to accuracy (s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        plots.append((f"{workload}: time to accuracy against ranks", png(fig)))
    if not plots:
        return None
    return View("distributed: time to accuracy against ranks (median per entry; missed runs "
                "left out of the lines)", plots=plots)
