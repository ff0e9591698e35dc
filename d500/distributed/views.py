"""Level 3's sections of the leaderboard, from the ledger alone: per workload and world size every
(entry, backend) with its scheme and compressor, time to accuracy (median over the runs of its
required seeds, a miss or an interrupted one counting as infinity; explorations never count;
RCP-scaled as the workload's board: d500.training.score.scaled),
test accuracy, bytes per step, communication share, scaling efficiency against its own runs at the
reference world size, the ratio of its time to the DDP baseline's, its parallel dimensions
(data x pipeline x tensor and a ZeRO stage, beside the scheme where an entry declares them) and
the memory one rank holds; then time to accuracy against ranks per entry (a plot per workload).

When the boards hold runs of several machines (and the organiser did not pass --across-machines),
the time-based figures (time to accuracy, communication share, scaling efficiency, speed-up, vs
DDP) are computed per machine, each machine's table and plots headed by its hardware, reference
and baseline runs taken from the same machine; test accuracy and bytes per step, comparable on
any machine, are pooled in one table."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from d500 import metrics
from d500.leaderboard.environments import apart, hardware_text, machine
from d500.leaderboard.ranking import origin, run_loaded, submission_label
from d500.levels import View
from d500.provenance import loaded_share
from d500.training import seeds
from d500.training.score import scaled

NATIVE = "ddp"


@dataclass
class Row:
    """One (workload, world size, submission, backend), on one machine when machines are kept
    apart: its runs and their medians."""

    workload: str
    ranks: int
    submission: str
    backend: str
    machine: str = ""  # hardware key when machines are kept apart, else ""
    scheme: str = "?"
    compressor: str = "none"
    dims: str = ""  # "D×P×T" and the shard stage, where the entry declared dimensions
    runs: list[dict[str, Any]] = field(default_factory=list)
    oversubscribed: bool = False
    contended: bool = False  # other processes took a share of the machine during a run
    forced: bool = False  # imported past a failing d500 check: listed after every other row
    package: str = ""  # the sha256 of the package its runs came in, or (a reproduction) re-ran
    reproduction: bool = False  # `d500 reproduce` runs: listed right after the row they re-ran
    drawn: bool = False  # runs at seeds the organiser drew (d500 reproduce --fresh-seeds): scored
    known: bool = False  # scored on seeds known before its runs beside drawn rows: listed after

    def median(self, name: str, missing: float | None = None, every: bool = False
               ) -> float | None:
        """Median of a figure over the counted runs (a miss counts as `missing` if given;
        `every`: a figure that holds whatever the status, as memory, from every run)."""
        values = []
        for r in self.runs:
            v = r["figures"].get(name) if every or r["status"] == "succeeded" else None
            if v is None:
                v = missing
            if v is not None and not math.isnan(v):
                values.append(float(v))
        return statistics.median(values) if values else None

    @property
    def label(self) -> str:
        """The scheme, with the dimensions where the entry declared them."""
        return f"{self.scheme} {self.dims}" if self.dims else self.scheme

    @property
    def time(self) -> float | None:
        return self.median("time_to_accuracy", math.inf)

    def test(self) -> str:
        """The median test quality, formatted: accuracy, or a language model's test
        log-perplexity in nats (d500.training.score.test_name)."""
        from d500.training.score import test_name
        name = test_name(self.runs[0]) if self.runs else "test_accuracy"
        return _fmt(name, self.median(name))


def rows(level: int, boards: Sequence[Any], ledger: Any, per_machine: bool = False
         ) -> list[Row]:
    """The rows of the boards' workloads (their rules versions), counted runs only (the rules'
    required seeds: d500.training.seeds); with `per_machine`, one row per machine the runs of
    an entry ran on. A row forced in past `d500 check` follows every complete one."""
    wanted = {(b.workload, b.workload_sha256) for b in boards}
    envs = ledger.environments() if per_machine else {}
    found: dict[tuple[str, int, str, str, str], Row] = {}
    for r in ledger.runs(level=level):
        if (r["workload"], r["workload_sha256"]) not in wanted or r["study"] is not None \
                or r["status"] == "running":
            continue
        key = (r["workload"], r["world_size"] or 1,
               submission_label(r["submission"] or "", origin(r)), r["backend"] or "",
               machine(envs.get(r["environment"])) if per_machine else "")
        row = found.setdefault(key, Row(*key))
        h = r["hyperparameters"] or {}
        row.scheme, row.compressor = h.get("scheme", row.scheme), h.get("compressor", "none")
        row.dims = dims(h, key[1])
        row.oversubscribed |= bool((r["details"] or {}).get("oversubscribed"))
        row.contended |= run_loaded(r)
        source = origin(r) or {}
        row.forced |= bool(source.get("forced"))
        row.package, row.reproduction = source.get("sha256") or "", bool(source.get("reproduction"))
        row.drawn = bool(source.get("drawn"))
        row.runs.append(r)
    for row in found.values():  # the required seeds only (an interrupted one: a miss), or the
        # organiser's drawn ones; times RCP-scaled as the workload's board scales them
        row.runs = scaled(seeds.split(row.runs, own_draws=True)[0])
    found = {key: row for key, row in found.items() if row.runs}
    _drawn_score(list(found.values()))
    from d500.competition import same_code
    copies = same_code.copies(ledger) if hasattr(ledger, "packages") else {}
    for x in found.values():  # another name's package of code an entry brought first: after
        if (copy := copies.get(x.package)) is not None and not x.reproduction:
            x.known = True
            x.submission += f" · unranked: its code is entry {copy.entry}'s"
    ordered = sorted((x for x in found.values() if not x.reproduction), key=lambda x: (
        x.workload, x.ranks, x.known, x.forced, _key(x.time), x.submission, x.backend))
    for copy in sorted((x for x in found.values() if x.reproduction),
                       key=lambda x: (x.workload, x.ranks, x.submission, x.backend)):
        ordered.insert(_beside(ordered, copy), copy)
    return ordered


def _drawn_score(rows: list[Row]) -> None:
    """As the workload's board (d500.leaderboard.ranking): a row at N or more seeds the organiser
    drew scores its result, and the package's own row goes beside it (`reproduction`); fewer
    drawn seeds go beside the package's row; other rows of that workload and world size, scored
    on seeds known before their runs, follow the rows at drawn seeds (`known`)."""
    scoring = set()
    for x in (x for x in rows if x.drawn):
        first = x.runs[0]
        need = seeds.scoring(first.get("workload_text"), first.get("workload_file")) or 1
        if len({r.get("seed") for r in x.runs}) < need:
            x.reproduction = True
        else:
            scoring.add((x.workload, x.ranks, x.backend, x.package))
    for x in (x for x in rows if not x.drawn and not x.reproduction):
        if (x.workload, x.ranks, x.backend, x.package) in scoring:
            x.reproduction = True
        else:
            x.known = any((w, n) == (x.workload, x.ranks) for w, n, _, _ in scoring)


def _beside(ordered: list[Row], copy: Row) -> int:
    """Where a reproduction's row goes: right after the row of the package it re-ran (same
    workload, world size and machine; the same backend first), else after its workload and
    world size's last row, else at the end (as on the workload's board)."""
    here = [(i, x) for i, x in enumerate(ordered) if (x.workload, x.ranks, x.machine) ==
            (copy.workload, copy.ranks, copy.machine)]
    for same in (lambda x: x.package == copy.package and x.backend == copy.backend,
                 lambda x: x.package == copy.package, lambda x: True):
        found = [i for i, x in here if same(x)]
        if found:
            return found[-1] + 1
    return len(ordered)


def dims(hyper: dict[str, Any], world: int) -> str:
    """"D×P×T" (data, pipeline, tensor) of a run's recorded hyperparameters at `world` ranks,
    with its ZeRO stage where it has one; "" for a flat scheme (data parallel over every rank)."""
    if not any(k in hyper for k in ("data", "pipeline", "tensor", "shard")):
        return ""
    p, t = int(hyper.get("pipeline", 1)), int(hyper.get("tensor", 1))
    d = int(hyper.get("data", world // max(1, p * t)))
    shard = hyper.get("shard", "none")
    return f"{d}×{p}×{t}" + ("" if shard == "none" else f" {shard}")


def _key(value: float | None) -> float:
    return math.inf if value is None else value


def efficiency(row: Row, every: list[Row], reference: int = 1) -> tuple[float | None, ...]:
    """(scaling efficiency, speed-up) of a row against the same entry's rows at the reference
    world size on the same machine, from the medians (None without a reference or a finite
    time)."""
    ref = next((x for x in every if (x.workload, x.submission, x.backend, x.ranks, x.machine) ==
                (row.workload, row.submission, row.backend, reference, row.machine)), None)
    t, t_ref = row.time, ref.time if ref is not None else None
    if t is None or t_ref is None or not (math.isfinite(t) and math.isfinite(t_ref)) or t <= 0:
        return None, None
    return reference * t_ref / (row.ranks * t), t_ref / t


def views(level: int, boards: Sequence[Any], ledger: Any) -> list[View]:
    machines = apart(boards)
    every = rows(level, boards, ledger, per_machine=bool(machines))
    if not every:
        return []
    refs = {b.workload: _reference(b, ledger) for b in boards}
    if not machines:
        return [v for v in (table_view(every, refs), plot_view(every)) if v is not None]
    envs = ledger.environments()
    found = dict.fromkeys([*machines, *(row.machine for row in every)])
    out: list[View | None] = []
    for key in found:
        mine = [row for row in every if row.machine == key]
        if not mine:
            continue
        on = machines.get(key) or hardware_text(envs.get(mine[0].runs[0]["environment"]))
        out += [table_view(mine, refs, on), plot_view(mine, on)]
    out.append(pooled_view(rows(level, boards, ledger)))
    return [v for v in out if v is not None]


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


def table_view(every: list[Row], refs: dict[str, int], on: str | None = None) -> View:
    """Every row's figures; `on` (the hardware of the one machine the rows ran on, when
    machines are kept apart) keeps the time-based figures only (pooled_view has the rest)."""
    out = []
    notes = []
    marks = {"*": False, "†": False}
    for row in every:
        eff, speed = efficiency(row, every, refs.get(row.workload, 1))
        ddp = next((x for x in every if (x.workload, x.ranks, x.backend, x.machine) ==
                    (row.workload, row.ranks, row.backend, row.machine) and x.scheme == NATIVE),
                   None)
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
        pooled = [] if on else [row.test(),
                                _fmt("bytes_per_step", row.median("bytes_per_step")),
                                _fmt("memory_per_rank", row.median("memory_per_rank", every=True))]
        out.append([row.workload, ranks, row.submission, row.label, row.compressor,
                    row.backend, _fmt("time_to_accuracy", row.time), *pooled,
                    _fmt("comm_share", row.median("comm_share")),
                    _fmt("scaling_efficiency", eff), _fmt("speedup", speed), ratio, counts])
    if marks["*"]:
        notes.append("* more ranks than the machine has cores (oversubscribed): times at this "
                     "world size measure contention as much as scaling")
    if marks["†"]:
        notes.append(f"† other processes took more than {loaded_share():g} of the machine's cores "
                     "during a run of this row (its details: load_average, during): its times are "
                     "not comparable")
    notes.append("time to accuracy and the other figures: median over the entry's runs at that "
                 "world size (a missed target counts as ∞; time to accuracy multiplied by MLPerf's "
                 "RCP scale where the runs' epochs to target average below the workload's "
                 "reference convergence, as on the workload's board and in d500 check's scoring "
                 "lines); scaling efficiency = ref·T_ref / "
                 "(N·T_N) against the same entry at the workload's reference world size; vs DDP = "
                 "T_N / T_N of the ddp baseline at the same world size and backend; comm share "
                 "is not measured for DDP (it overlaps communication with the backward pass); "
                 "a scheme's D×P×T = data×pipeline×tensor ranks (and a ZeRO stage) where the "
                 "entry declares dimensions; mem/rank = the most bytes of parameters, gradients "
                 "and optimizer state one rank holds; test = test accuracy, or a language "
                 "model's test log-perplexity (nats, lower is better)")
    if on:
        notes.append("rows of this machine only: the reference and DDP runs are this machine's "
                     "too; times measured on different hardware are never compared "
                     "(d500 leaderboard --across-machines pools every machine's runs)")
    return View(f"distributed{_on(on)}: every entry per workload and world size",
                ["workload", "ranks", "submission", "scheme", "compressor", "backend",
                 "time to accuracy", *([] if on else ["test", "bytes/step", "mem/rank"]),
                 "comm share",
                 "scaling eff", "speed-up", "vs DDP", "ok/runs"], out, notes=notes)


def pooled_view(every: list[Row]) -> View:
    """What compares across machines, pooled over every machine's runs of an entry: test
    accuracy, bytes per step and epochs to the target."""
    out = [[row.workload, str(row.ranks), row.submission, row.label, row.compressor,
            row.backend, row.test(),
            _fmt("bytes_per_step", row.median("bytes_per_step")),
            _fmt("memory_per_rank", row.median("memory_per_rank", every=True)),
            _fmt("epochs", row.median("epochs", math.inf)),
            f"{sum(r['status'] == 'succeeded' for r in row.runs)}/{len(row.runs)}"]
           for row in every]
    return View("distributed over every machine: test quality, bytes per step and epochs to "
                "the target (comparable on any machine: pooled)",
                ["workload", "ranks", "submission", "scheme", "compressor", "backend",
                 "test", "bytes/step", "mem/rank", "epochs", "ok/runs"], out,
                notes=[("medians over every machine's runs of the entry at that world size "
                        "(a missed target counts as ∞ epochs)")])


def _on(on: str | None) -> str:
    return f" on {on}" if on else ""


def plot_view(every: list[Row], on: str | None = None) -> View | None:
    """Time to accuracy against ranks, one line per (entry, backend), a plot per workload (the
    rows of one machine, `on` its hardware, when machines are kept apart)."""
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
        plots.append((f"{workload}: time to accuracy against ranks{_on(on)}", png(fig)))
    if not plots:
        return None
    return View(f"distributed{_on(on)}: time to accuracy against ranks (median per entry; missed "
                "runs left out of the lines)", plots=plots)
