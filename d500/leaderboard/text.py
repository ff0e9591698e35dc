"""The leaderboard's words, shared by every renderer: titles, the ranking rule, column headers,
the cells of a board's rows, the runs not counted and each entry's provenance line."""

from __future__ import annotations

import math
import time
from typing import Any

from d500 import backends
from d500 import metrics as _metrics
from d500.leaderboard.ranking import Board, Entry
from d500.metrics import Metric

STATUS_ORDER = ("succeeded", "missed", "failed", "diverged", "timeout", "interrupted", "running")
EXCLUDED_HEADERS = ["run", "submission", "backend", "status", "seed", "kind", "error"]
TEXT_COLUMNS = ("submission", "backend", "runs", "verify", "provenance")  # the rest: numbers
COMPACT_DROPS = ("tuning trials", "provenance")  # what a compact table leaves to the full board
NO_RUNS = "No runs recorded yet."


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
    """A board's column headers; `compact` (terminal summaries) drops the tuning-trials and
    provenance columns, and the submission column when every submission is its backend."""
    cols = ["rank", "submission", "backend"] + [m.label for m in columns(board)]
    if board.rank_by is not None:
        cols.insert(4, "× best")
    cols += ["runs", "tuning trials", "verify", "provenance"]
    return [cols[i] for i in _kept(board, cols, compact)]


def row(board: Board, entry: Entry, compact: bool = False) -> list[str]:
    """An entry's cells under `headers(board, compact)`; compact cells omit the "(n=…)" that
    repeats the runs column."""
    cells = ["—" if entry.rank is None else str(entry.rank), entry.submission, entry.backend]
    cells += [cell(entry, m, count=not compact) for m in columns(board)]
    if board.rank_by is not None:
        cells.insert(4, ratio(entry))
    trials = (f"{len(entry.trials)} ({_metrics.format_duration(entry.tuning_seconds)})"
              if entry.trials else "0")
    cells += [counts(entry), trials, verify(entry), " | ".join(provenance(entry)) or "—"]
    full = headers(board)
    return [cells[i] for i in _kept(board, full, compact)] if compact else cells


def _kept(board: Board, cols: list[str], compact: bool) -> list[int]:
    if not compact:
        return list(range(len(cols)))
    drop = set(COMPACT_DROPS)
    if all(e.submission == e.backend for e in board.entries):
        drop.add("submission")
    return [i for i, h in enumerate(cols) if h not in drop]


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
    return f"{text} (n={len(vals)})" if count else text


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
    """One row (under EXCLUDED_HEADERS) per run or trial that did not succeed."""
    return [[str(r["id"]), r["submission"] or "", r["backend"] or "", r["status"],
             "" if r["seed"] is None else str(r["seed"]),
             "trial" if r["study"] is not None else "run", (r["error"] or "")[:120]]
            for r in board.not_succeeded]


def problems(board: Board) -> list[str]:
    """Every integrity problem `d500 ledger verify` reports for the board's runs."""
    return sorted({p for e in board.entries for p in e.problems})


def provenance(entry: Entry) -> list[str]:
    """One line per distinct environment the entry's runs ran in, and a mark when runs were
    timed on a loaded machine (their recorded load averages, d500.provenance.LoadWatch)."""
    lines = list(dict.fromkeys(environment(env, entry.backend) for env in entry.environments))
    return lines + ([loaded] if (loaded := load_mark(entry)) else [])


def load_mark(entry: Entry) -> str:
    """"⚠ loaded machine: k of n runs ..." when runs were timed while other processes kept the
    machine busy; empty otherwise."""
    timed = [r["details"]["load_average"] for r in entry.runs
             if isinstance(r.get("details", {}).get("load_average"), dict)]
    loaded = [w for w in timed if w.get("loaded")]
    if not loaded:
        return ""
    others = max((v for w in loaded for v in w.get("others") or [] if v is not None), default=0)
    cores = loaded[0].get("usable_cores", "?")
    return (f"⚠ loaded machine: {len(loaded)} of {len(timed)} timed run(s), other processes' "
            f"load up to {others:.1f} on {cores} cores")


def environment(env: dict[str, Any], backend: str | None) -> str:
    """Machine, peak, the backend's framework version and onnx/numpy, git commit: one line."""
    cpu = env.get("cpu", {})
    gib = (env.get("memory_bytes") or 0) / 2**30
    pk = env.get("packages", {})
    framework = backends.framework(backend or "")
    wanted = [framework[1] if framework else "", "onnx", "numpy"]
    vers = [f"{k} {pk[k]}" for k in dict.fromkeys(wanted) if k and pk.get(k)]
    gpus = ", ".join(g.get("name", "?") for g in env.get("gpus") or [])
    git = env.get("git") or {}
    commit = (git.get("commit") or "")[:8] + ("+dirty" if git.get("dirty") else "")
    parts = [f"{cpu.get('model', '?')} ×{cpu.get('logical_cores', '?')}", f"{gib:.0f} GiB"]
    if gpus:
        parts.append(gpus)
    if env.get("peak_flops"):
        loaded = (env.get("peak_flops_conditions") or {}).get("loaded")
        parts.append(f"peak {env['peak_flops'] / 1e9:.0f} GFLOP/s"
                     + (" (measured under load)" if loaded else ""))
    count = (env.get("threads") or {}).get("count")
    if count:
        parts.append(f"{count} thread{'s' if count != 1 else ''}")
    parts += vers
    if commit:
        parts.append(f"git {commit}")
    return " · ".join(parts)
