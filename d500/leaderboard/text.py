"""The leaderboard's words, shared by every renderer: titles, the ranking rule, column headers,
the cells of a board's rows (each row's environments by their legend labels), the sections of a
board ranked per machine, the notes on what compares across machines, the runs not counted."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from d500 import metrics as _metrics
from d500 import timing
from d500.leaderboard.environments import Legend, hardware_text, machine_columns
from d500.leaderboard.ranking import Board, Entry, submission_label
from d500.metrics import Metric
from d500.provenance import is_loaded

STATUS_ORDER = ("succeeded", "missed", "failed", "diverged", "timeout", "interrupted", "running")
EXCLUDED_HEADERS = ["run", "submission", "backend", "status", "seed", "kind", "error"]
TEXT_COLUMNS = ("submission", "backend", "runs", "verify", "env")  # the rest: numbers
COMPACT_DROPS = ("tuning trials", "env")  # what a compact table leaves to the full board
NO_RUNS = "No runs recorded yet."
LEGEND_TITLE = "Environments"
ACROSS_FLAG = "d500 leaderboard --across-machines"


def title(board: Board) -> str:
    level = f"level {board.level}" if board.level is not None else "level ?"
    ranks = f" · {board.world_size} rank{'s' if board.world_size != 1 else ''}" \
        if board.world_size else ""
    return f"{level} · {board.workload}{ranks}"


def source(ledger_path: Any, boards: list[Board]) -> str:
    """Where and when a leaderboard was generated, and from how many runs."""
    runs = sum(b.run_count for b in boards)
    return f"generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')} from {ledger_path} ({runs} runs)"


def rule_line(board: Board) -> str:
    """How the board is ranked, in one sentence."""
    if board.rules_problem:
        return (f"unranked: the workload file recorded with these runs no longer reads as rules "
                f"({board.rules_problem}); recorded figures shown as they are")
    if board.rank_by is None:
        return "unranked: no workload file was recorded with these runs"
    how = board.how if board.how in _metrics.AGGREGATIONS else "median"
    explain = ("median over seeds and repetitions, [min – max] spread" if how == "median" else
               "MLPerf olympic mean (best and worst run dropped), [min – max] spread")
    missing = ("; a run that missed its target, failed or diverged counts as ∞"
               if board.rank_by.missing is not None else "")
    return (f"ranked by {board.rank_by.name} ({board.rank_by.direction} is better), "
            f"{explain}{missing}; interrupted runs are listed, not counted")


def columns(board: Board) -> list[Metric]:
    """The ranking metric first, then the workload's other metrics in its order."""
    if board.rank_by is None:
        return board.metrics
    return [board.rank_by] + [m for m in board.metrics if m.name != board.rank_by.name]


def numeric(header: str) -> bool:
    """Whether a board column holds figures (right-aligned) rather than words."""
    return header not in TEXT_COLUMNS


def headers(board: Board, compact: bool = False) -> list[str]:
    """A board's column headers; `compact` (terminal summaries) drops the tuning-trials column,
    the env column unless the board holds rows of several machines, and the submission column
    when every submission is its backend."""
    cols = ["rank", "submission", "backend"] + [m.label for m in columns(board)]
    if board.rank_by is not None:
        cols.insert(4, "× best")
    cols += ["runs", "tuning trials", "verify", "env"]
    return [cols[i] for i in _kept(board, cols, compact)]


def row(board: Board, entry: Entry, compact: bool = False, legend: Legend | None = None
        ) -> list[str]:
    """An entry's cells under `headers(board, compact)`; compact cells omit the "(n=…)" that
    repeats the runs column. The env cell names the entry's environments by their labels in
    `legend` (the leaderboard's; by default one of this board alone)."""
    legend = legend if legend is not None else Legend.of([board])
    cells = [rank_cell(entry), submission(entry), entry.label]
    cells += [cell(entry, m, count=not compact) for m in columns(board)]
    if board.rank_by is not None:
        cells.insert(4, ratio(entry))
    trials = (f"{len(entry.trials)} ({_metrics.format_duration(entry.tuning_seconds)})"
              if entry.trials else "0")
    mark = load_separates(table_rows(board, entry))
    cells += [counts(entry), trials, verify(entry), env_cell(entry, legend, mark=mark)]
    full = headers(board)
    return [cells[i] for i in _kept(board, full, compact)] if compact else cells


def _kept(board: Board, cols: list[str], compact: bool) -> list[int]:
    if not compact:
        return list(range(len(cols)))
    drop = set(COMPACT_DROPS) - ({"env"} if len(board.machines) > 1 else set())
    if all(e.submission == e.backend and not e.package for e in board.entries):
        drop.add("submission")
    return [i for i, h in enumerate(cols) if h not in drop]


def rank_cell(entry: Entry) -> str:
    """The rank as shown: in parentheses for a row timed on a loaded machine (ranked apart, among
    such rows only), "—" for an unranked one."""
    if entry.rank is None:
        return "—"
    return f"({entry.rank})" if entry.loaded else str(entry.rank)


def submission(entry: Entry) -> str:
    """The entry's submission as shown (ranking.submission_label: package or reproduction),
    and why its seeds leave it unranked (ranking.Entry.seeds_note)."""
    label = submission_label(entry.submission, entry.package)
    return f"{label} · {entry.seeds_note}" if entry.seeds_note else label


def env_cell(entry: Entry, legend: Legend, short: bool = False, mark: bool = True) -> str:
    """The entry's environments by legend label, and the loaded-machine mark when its runs were
    timed on a busy machine and `mark` (the mark tells its table's rows apart, load_separates):
    in full, or (`short`, for a terminal's narrow column) a bare "⚠" that `load_notes` explains
    under the table."""
    labels = ", ".join(legend.labels(entry)) or "—"
    loaded = load_mark(entry) if mark else ""
    if loaded and short:
        return f"{labels} ⚠"
    return f"{labels} · {loaded}" if loaded else labels


def load_notes(entries: Sequence[Entry]) -> list[str]:
    """One line per distinct loaded-machine mark among `entries`, naming the rows it concerns
    (every row, when all share it): what a short env cell's "⚠" stands for."""
    rows: dict[str, list[str]] = {}
    for e in entries:
        mark = load_mark(e)
        if mark:
            rows.setdefault(mark, []).append(f"{submission(e)} / {e.label}")
    if len(rows) == 1 and len(next(iter(rows.values()))) == len(entries) > 1:
        return [f"{next(iter(rows))} (every row)"]
    return [f"{mark} ({', '.join(names)})" for mark, names in rows.items()]


def table_rows(board: Board, entry: Entry) -> list[Entry]:
    """The rows of the table (the machine's section, when the board ranks per machine) that
    holds `entry`'s row."""
    return [e for e in board.entries if not board.per_machine or e.machine == entry.machine]


def load_separates(entries: Sequence[Entry]) -> bool:
    """Whether the loaded-machine mark tells these rows (one table's) apart: some carry it and
    some do not. When every row carries it, the rows say nothing and load_note says it once."""
    marked = [bool(load_mark(e)) for e in entries]
    return any(marked) and not all(marked)


def load_note(entries: Sequence[Entry]) -> str:
    """The one note under a table every row of which carries the loaded-machine mark (else
    ""): that all its runs ran on a loaded machine, or which share of each row's did."""
    found = [(e, _load(e)) for e in entries]
    if not found or any(load is None for _, load in found):
        return ""
    loads = [load for _, load in found if load is not None]
    worst = max(load[2] for load in loads)
    cores = loads[0][3]
    how = f"other processes' load up to {worst:.1f} on {cores} cores"
    if all(loaded == timed for loaded, timed, _, _ in loads):
        total = sum(timed for _, timed, _, _ in loads)
        return (f"⚠ loaded machine: all of this table's runs ran on a loaded machine ({total} "
                f"timed run(s), {how})")
    marks = {load_mark(e) for e, _ in found}
    if len(marks) == 1:
        return f"{marks.pop()}: every row of this table"
    return ("⚠ loaded machine, every row of this table: " + "; ".join(
        f"{submission(e)} / {e.label}: {load[0]} of {load[1]} timed run(s)"
        for e, load in found if load is not None) + f"; {how}")


def sections(board: Board, legend: Legend | None = None) -> list[tuple[str, list[Entry]]]:
    """The board's rows in sections: one per machine, headed by its hardware and environment
    labels, when the board ranks per machine; otherwise one section without a heading."""
    if not board.per_machine:
        return [("", list(board.entries))]
    legend = legend if legend is not None else Legend.of([board])
    grouped: dict[str, list[Entry]] = {}
    for e in board.entries:
        grouped.setdefault(e.machine, []).append(e)
    out = []
    for group in grouped.values():
        envs = [env for e in group for env in e.environments]
        labels = ", ".join(dict.fromkeys(lbl for e in group for lbl in legend.labels(e)))
        out.append((f"on {hardware_text(envs[0] if envs else None)}"
                    + (f" ({labels})" if labels else "") + ": ranked among these rows", group))
    return out


def machine_notes(board: Board) -> list[str]:
    """What the board's rows measured on several machines mean: how it is ranked and which of
    its columns compare across machines (nothing when all rows share one machine)."""
    count = len(board.machines)
    if count < 2:
        return []
    dependent, comparable = machine_columns([board])
    out = []
    name = board.rank_by.name if board.rank_by else ""
    if board.per_machine:
        out.append(f"rows measured on {count} different machines: {name} depends on the hardware, "
                   f"so each machine's rows are ranked apart, never against another hardware's "
                   f"({ACROSS_FLAG} ranks them together)")
    elif board.rank_by is not None and name in dependent:
        out.append(f"rows measured on {count} different machines, ranked together by {name} "
                   f"because the organiser asked ({ACROSS_FLAG}): these times come from "
                   f"different hardware")
    elif board.rank_by is not None:
        out.append(f"rows measured on {count} different machines, ranked together by {name}, "
                   f"which is comparable on any machine")
    out.append(_which(dependent, comparable))
    return out


def _which(dependent: list[str], comparable: list[str]) -> str:
    parts = []
    if dependent:
        parts.append(f"machine-dependent (times, rates and ratios of times: compare rows of the "
                     f"same hardware only): {', '.join(dependent)}")
    if comparable:
        parts.append(f"comparable across machines: {', '.join(comparable)}")
    return "; ".join(parts)


def legend_notes(boards: list[Board], legend: Legend) -> list[str]:
    """The legend's notes: what the env column refers to, which hardware each label ran on
    when there are several, and which columns of the leaderboard are machine-dependent."""
    out = [("each row's env column names the environments its runs ran in; runs on the same "
            "hardware (CPU model, logical cores, memory, GPUs, architecture) share a machine")]
    machines = legend.machines
    if len(machines) > 1:
        hardware = {i.machine: i.hardware for i in reversed(legend.items)}
        out.append(f"{len(machines)} machines: " + "; ".join(
            f"{', '.join(legend.of_machine(m))} on {hardware[m]}" for m in machines))
        if any(b.across_machines for b in boards):
            out.append("machine-dependent figures from different machines are ranked against "
                       f"each other here, as the organiser asked ({ACROSS_FLAG.split()[-1]}): "
                       "they come from different hardware; accuracies, errors and steps or "
                       "epochs to the target are comparable across machines")
        else:
            out.append("machine-dependent figures from different machines are never ranked "
                       f"against each other unless the organiser passes {ACROSS_FLAG.split()[-1]}; "
                       "accuracies, errors and steps or epochs to the target are ranked across "
                       "machines")
    which = _which(*machine_columns(boards))
    if which:
        out.append(which)
    return out


def legend_rows(legend: Legend) -> list[list[str]]:
    """[label, provenance] per environment."""
    return [[item.label, item.text] for item in legend.items]


def cell(entry: Entry, metric: Metric, count: bool = True) -> str:
    """The aggregate with its unit, its [min – max] spread when runs differ, and (n=runs)."""
    value = entry.aggregate.get(metric.name)
    vals = entry.values.get(metric.name, [])
    if value is None:
        return "—"
    text = metric.format(value)
    lo_hi = entry.spread.get(metric.name)
    if lo_hi and len(vals) > 1 and lo_hi[0] != lo_hi[1]:
        text += f" [{metric.format(lo_hi[0], unit=False)} – {metric.format(lo_hi[1], unit=False)}]"
    text = f"{text} (n={len(vals)})" if count else text
    return f"{text} {UNSTABLE_MARK}" if unstable(entry, metric) else text


UNSTABLE_MARK = "~unstable"


def unstable(entry: Entry, metric: Metric) -> bool:
    """Whether some run of the entry timed `metric` with repetitions that spread widely."""
    return any(timing.unstable((r.get("details") or {}).get(key))
               for r in entry.runs for key in metric.repetitions)


def unstable_note(entries: Sequence[Entry], metrics: Sequence[Metric]) -> str:
    """The line under a table that has an unstable cell, saying what the mark means."""
    if not any(unstable(e, m) for e in entries for m in metrics):
        return ""
    return (f"{UNSTABLE_MARK}: a run's timed repetitions spread widely (interquartile range "
            f"above {timing.UNSTABLE:.0%} of the median): its figure is not a stable one")


def counts(entry: Entry) -> str:
    """Runs per status, and how many succeeded runs missed the target."""
    c = entry.counts
    text = " ".join(f"{c[s]} {s}" for s in STATUS_ORDER if c[s]) or "0"
    return text + (f" ({entry.missed} missed the target)" if entry.missed else "")


def ratio(entry: Entry) -> str:
    if entry.ratio is None:
        return "—"
    return "∞" if math.isinf(entry.ratio) else f"{entry.ratio:.2f}×"


def verify(entry: Entry) -> str:
    return "✓ intact" if entry.verified else f"✗ {len(entry.problems)} problem(s)"


def excluded_rows(board: Board) -> list[list[str]]:
    """One row (under EXCLUDED_HEADERS) per run or trial that did not succeed; its error (an
    entry's own exception's words: a terminal's escapes in one were printed as raised) with
    control and invisible characters escaped."""
    from d500.say import shown
    return [[str(r["id"]), r["submission"] or "", r["backend"] or "", r["status"],
             "" if r["seed"] is None else str(r["seed"]),
             "trial" if r["study"] is not None else "run", shown((r["error"] or "")[:120])]
            for r in board.not_succeeded]


def problems(board: Board) -> list[str]:
    """Every integrity problem `d500 ledger verify` reports for the board's runs."""
    return sorted({p for e in board.entries for p in e.problems})


def load_mark(entry: Entry) -> str:
    """"⚠ loaded machine: k of n runs ..." when runs were timed while other processes kept the
    machine busy; empty otherwise."""
    load = _load(entry)
    if load is None:
        return ""
    loaded, timed, others, cores = load
    apart = "; ranked apart, rank in parentheses" if entry.loaded and entry.rank else ""
    return (f"⚠ loaded machine: {loaded} of {timed} timed run(s), other processes' "
            f"load up to {others:.1f} on {cores} cores{apart}")


def _load(entry: Entry) -> tuple[int, int, float, Any] | None:
    """(loaded runs, timed runs, other processes' highest load, usable cores) of an entry with
    runs timed on a loaded machine; None without one."""
    timed = [r["details"]["load_average"] for r in entry.runs
             if isinstance(r.get("details", {}).get("load_average"), dict)]
    loaded = [w for w in timed if is_loaded(w)]
    if not loaded:
        return None
    others = max((v for w in loaded for v in ([w["during"]] if isinstance(
        w.get("during"), (int, float)) else w.get("others") or []) if v is not None), default=0)
    return len(loaded), len(timed), float(others), loaded[0].get("usable_cores", "?")
