"""The organiser's summary at the top of levels 0 and 1: per backend (level 1) or submission x
backend (level 0), AlgoPerf's performance profile over the level's ranked workloads
(d500.profile), the geometric mean of "times the best" and each backend's ONNX conformance count
from its latest complete recorded `d500 conformance` run on the machine of the row's runs
(d500.conformance_runs; a count of one machine is never shown beside another machine's runs).

    counts, words = conformance(ledger)   # {(backend, machine key): Count}, {machine: hardware}
    s = summarise(boards, by_submission=False, conformance=counts)
    s.rows[0].score, s.rows[0].geomean, s.profile.rho[s.rows[0].key]   # numbers only
    views(boards, ledger, by_submission=True, builtin="builtin")  # [View] or []

A workload counts when its board ranks (its rules name rank_by) and some entry has a ranked
figure; only the newest rules version of each workload counts. An entry's "times the best" on a
workload is its board's ratio (Board/Entry in ranking.py: the aggregate of the ranking metric
against the best entry's, in the metric's own direction, so >= 1). At level 1 a backend with
several entries on one board (of one machine) takes the best of them. Entries timed on a loaded
machine (ranked apart on their boards) count only where every entry of the board was.

When the boards hold entries of several machines, some workload is ranked by a machine-dependent
metric and the organiser did not pass --across-machines, there is one summary per machine, headed
by its hardware: each counts that machine's entries only, with their ratios as the boards rank
them (within the machine for a machine-dependent figure; across machines for a metric
comparable anywhere), so a backend's rows of different machines are never merged. Otherwise one
summary, as before.

    for key, words in per_machine(boards).items(): summarise(boards, False, machine=key)
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from d500 import profile
from d500.leaderboard.environments import (
    UNKNOWN,
    Legend,
    apart,
    hardware_text,
    machine_dependent,
)
from d500.leaderboard.environments import machine as machine_key
from d500.leaderboard.ranking import Board, comparable, reproduction, submission_label
from d500.levels import View
from d500.metrics import Metric

TITLE = "Organiser's summary"
NOT_RECORDED = "not recorded"
ONE_WORKLOAD = ("one workload: no ρ(τ) plot (over one workload it is a single jump per row); "
                "this table is the profile: geomean × best is each row's × best on it")


@dataclass
class Row:
    """One row: an entry (level 0: submission / backend; level 1: backend) and its figures."""

    key: str
    submission: str | None
    backend: str
    score: float  # the profile's normalised integral up to TAU_MAX
    best_on: int  # workloads on which it is the best
    ran: int  # workloads on which it has a ranked figure
    geomean: float | None  # of times the best, over the `ran` workloads
    # d500.conformance_runs.Count of each machine of its runs that recorded one (several only
    # when --across-machines pools machines into the row)
    conformance: tuple[Any, ...] = ()
    backend_row: bool = True  # False: a custom operator (level 0), conformance does not apply


@dataclass
class Summary:
    workloads: list[str]  # the N workloads counted
    rank_by: dict[str, Metric]  # workload -> the metric it is ranked by
    profile: profile.Profile
    rows: list[Row]  # best profile score first
    older_versions: int = 0  # boards left out: older rules versions of a counted workload
    on: str = ""  # the hardware in words of the one machine summarised ("" when not apart)


def per_machine(boards: Sequence[Board]) -> dict[str, str]:
    """{machine key: hardware in words} when the summary is one per machine (the boards hold
    entries of several machines, one of the newest rules versions is ranked by a
    machine-dependent metric, and the organiser did not pass --across-machines); else {}."""
    newest: dict[str, Board] = {}
    for board in boards:
        newest.setdefault(board.workload, board)
    if not any(b.rank_by is not None and machine_dependent(b.rank_by)
               for b in newest.values()):
        return {}
    return apart(boards)


def conformance(ledger: Any) -> tuple[dict[tuple[str, str], Any], dict[str, str]]:
    """Each (backend, machine key)'s latest complete conformance run (d500.conformance_runs
    Count), and every recorded machine's hardware in words."""
    from d500 import conformance_runs
    envs = ledger.environments()
    counts = conformance_runs.latest_by(
        ledger, lambda run: (run["backend"], machine_key(envs.get(run["environment"]))))
    return counts, {machine_key(env): hardware_text(env) for env in envs.values()}


def summarise(boards: Sequence[Board], by_submission: bool,
              conformance: Mapping[tuple[str, str], Any] | None = None,
              builtin: str | None = None, machine: str | None = None, on: str = ""
              ) -> Summary | None:
    """The summary's numbers over these boards (None when no board ranks anything). Level 0
    (`by_submission`): one row per submission x backend, conformance only on rows of the
    `builtin` submission (a backend's own implementation); level 1: one row per backend. A
    row's conformance is `conformance[(backend, machine key)]` of the machines of its runs (an
    unknown machine's, "", never matches). `machine` (a hardware key, see per_machine) counts
    that machine's entries only; `on` is its hardware in words, for the view."""
    conformance = conformance or {}
    ratios: dict[str, dict[str, float | None]] = {}
    names: dict[str, tuple[str | None, str]] = {}
    machines: dict[str, set[str]] = {}  # row key -> the machines of its runs
    rank_by: dict[str, Metric] = {}
    seen: set[str] = set()
    older: list[str] = []
    for board in boards:  # newest rules version of each workload first (ranking.py's order)
        if board.workload in seen:
            older.append(board.workload)
            continue
        seen.add(board.workload)
        entries = [e for e in board.entries if machine is None or e.machine == machine]
        if board.rank_by is None or all(e.ratio is None for e in entries):
            continue
        rank_by[board.workload] = board.rank_by
        for e in comparable([e for e in entries if not reproduction(e)]):  # load: apart
            name = submission_label(e.submission, e.package)  # a package's rows apart
            key = f"{name} / {e.backend}" if by_submission or e.package else e.backend
            names.setdefault(key, (name if by_submission or e.package else None, e.backend))
            machines.setdefault(key, set()).add(e.machine)
            per = ratios.setdefault(key, {})
            if e.ratio is not None:
                have = per.get(board.workload)
                per[board.workload] = e.ratio if have is None else min(have, e.ratio)
    if not rank_by:
        return None
    workloads = list(rank_by)
    p = profile.build(ratios, workloads)
    order = {m: i for i, m in enumerate(Legend.of(boards).machines)}  # first recorded first
    rows = []
    for key, (submission, backend) in names.items():
        own = not by_submission or submission == builtin
        ran_on = sorted(machines[key], key=lambda m: order.get(m, -1)) if own else []
        counts = tuple(conformance[backend, m] for m in ran_on if m and (backend, m) in conformance)
        rows.append(Row(key, submission, backend, p.score(key), p.best_on(key), p.ran(key),
                        p.geomean(key), counts, own))
    rows.sort(key=lambda r: (-r.score, math.inf if r.geomean is None else r.geomean, r.key))
    return Summary(workloads, rank_by, p, rows, sum(w in rank_by for w in older), on)


def views(boards: Sequence[Board], ledger: Any, by_submission: bool,
          builtin: str | None = None) -> list[View]:
    """The summary as a View (a list of one, or none when no board ranks anything); see
    summarise for `by_submission` and `builtin`."""
    counts, hardware = conformance(ledger)
    machines = per_machine(boards)
    if not machines:
        s = summarise(boards, by_submission, counts, builtin)
        return [] if s is None else [view(s, counts, by_submission, hardware)]
    found = (summarise(boards, by_submission, counts, builtin, key, words)
             for key, words in machines.items())
    return [view(s, counts, by_submission, hardware) for s in found if s is not None]


def view(s: Summary, counts: Mapping[tuple[str, str], Any], by_submission: bool,
         hardware: Mapping[str, str] | None = None) -> View:
    """The summary as a View; `counts` every (backend, machine) conformance count of the
    ledger, `hardware` each machine's hardware in words (for the counts it does not show)."""
    n = len(s.workloads)
    headers = ["submission", "backend"] if by_submission else ["backend"]
    headers += ["profile score", "best on", "geomean × best", "workloads run", "ONNX conformance"]
    rows = []
    for r in s.rows:
        cells = [r.submission or "", r.backend] if by_submission else [r.backend]
        rows.append([*cells, f"{r.score:.3f}", f"{r.best_on} / {n}", _times(r.geomean),
                     f"{r.ran} / {n}", _conformance(r)])
    on = f" on {s.on}" if s.on else ""
    title = (f"{TITLE}{on}: AlgoPerf performance profile over {n} workload{'s' * (n != 1)}, "
             "geometric mean of × best, ONNX conformance")
    caption = f"performance profile ρ(τ) over {n} workload{'s' * (n != 1)}"
    notes = _notes(s, counts, hardware or {})
    if n < 2:  # ρ over one workload is one jump per row, hidden on the frame: the table says it
        return View(title, headers, rows, [], [ONE_WORKLOAD, *notes])
    return View(title, headers, rows, [(caption, _plot(s))], notes)


def _times(value: float | None) -> str:
    if value is None:
        return "—"
    return "∞" if math.isinf(value) else f"{value:.2f}×"


def _conformance(r: Row) -> str:
    if not r.backend_row:
        return "—"
    if not r.conformance:
        return NOT_RECORDED
    return "; ".join(f"{c.passed} / {c.total} ({c.date})" for c in r.conformance)


def _notes(s: Summary, counts: Mapping[tuple[str, str], Any], hardware: Mapping[str, str]
           ) -> list[str]:
    """The summary's notes: what was profiled and ranked, and where the conformance counts come
    from (and those not shown, with their machines)."""
    n = len(s.workloads)
    ranked = Counter((m.name, m.direction) for m in s.rank_by.values())
    how = ", ".join(f"{name} ({direction} is better) on {k}"
                    for (name, direction), k in sorted(ranked.items()))
    rho = (f"ρ(τ): the share of the {n} workload{'s' * (n != 1)} on which the entry's ranked "
           f"figure is within τ × the best entry's, each in its own direction (ranked by "
           f"{how}). A workload the entry did not run, or ran without a ranked figure, counts "
           f"as never within τ (AlgoPerf). Profile score: ρ's integral over [1, "
           f"{profile.TAU_MAX:g}] divided by {profile.TAU_MAX - 1:g} (1 = the best on every "
           "workload); rows are sorted by it.")
    geomean = ("geomean × best: the geometric mean of × best over the workloads the entry ran "
               "only (their count is 'workloads run'): a missing workload does not raise it, so "
               "read it beside that count.")
    notes = [rho, geomean]
    if s.on:
        notes.append("rows of this machine only: a workload ranked by a machine-dependent "
                     "figure counts each row's × best against this machine's best; one ranked "
                     "by a figure comparable on any machine, against the best of every machine "
                     "(d500 leaderboard --across-machines gives one summary of every machine)")
    used = sorted({c.run_id: c for r in s.rows for c in r.conformance}.values(),
                  key=lambda c: c.run_id)
    versions = sorted({f"onnx {c.onnx_version}, opset {c.opset}" for c in used})
    conf = ("ONNX conformance: node tests passed of those run in the backend's latest complete "
            "`d500 conformance` run on the machine of the row's runs, with its date")
    if used:
        conf += (f" ({'; '.join(versions)}; ledger run"
                 f"{'s' * (len(used) != 1)} {', '.join(str(c.run_id) for c in used)})")
    conf += f"; partial (--op) runs never count; '{NOT_RECORDED}': no complete run recorded."
    if any(len(r.conformance) > 1 for r in s.rows):
        conf += (" A row pooling several machines shows each one's count, in the order its "
                 "machines were first recorded.")
    if any(not r.backend_row for r in s.rows):
        conf += " A custom operator's row shows '—': conformance is a backend's."
    notes.append(conf)
    shown = {c.run_id for c in used}
    others = [(c, m) for (_, m), c in sorted(counts.items()) if c.run_id not in shown]
    if others:
        notes.append("conformance recorded on other machines or for backends without a row "
                     "here, not shown: " + "; ".join(
                         f"{c.backend} {c.passed} / {c.total} ({c.date}) on "
                         f"{hardware.get(m) or UNKNOWN}" for c, m in others))
    if s.older_versions:
        notes.append(f"{s.older_versions} board{'s' * (s.older_versions != 1)} of older rules "
                     "versions left out: each workload counts with its newest rules")
    return notes


def _plot(s: Summary) -> bytes:
    from d500.leaderboard.plots import figure, png
    fig = figure(8, 3.4)
    ax = fig.add_subplot()
    for i, r in enumerate(s.rows):
        ax.step(s.profile.taus, s.profile.rho[r.key], where="post", label=r.key,
                color=f"C{i % 10}", ls=("-", "--", ":", "-.")[i // 10 % 4], lw=1.4)
    ax.set_xlabel("τ (times the best entry's ranked figure)")
    ax.set_ylabel("share of workloads ρ(τ)")
    ax.set_xlim(1.0, profile.TAU_MAX)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    fig.tight_layout()
    return png(fig)
