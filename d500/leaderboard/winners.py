"""Who won, said first: per level, per workload (per machine when its times are ranked per
machine), the best entry, why (its ranking figure), its margin over the runner-up and, at the
training levels, whether that margin holds over the seeds. Words only; Markdown and HTML render
the same rows at the top of the leaderboard, above every table.

    for level, title, rows in winners.levels(boards, legend):   # Row per workload (and machine)
        rows[0].workload, rows[0].winner, rows[0].figure, rows[0].margin, rows[0].seeds

Only each workload's newest rules version counts (older versions are ranked apart below).
Reproductions and forced imports are never ranked, so never win; entries timed on a loaded
machine are ranked apart, never a winner or a runner-up beside a clean one (where every entry
was, the winner is said with that mark). The seed verdict compares the
[min – max] spread the board shows of the two rows' figures over the seeds the rules chose: the
margin is significant when the ranges do not overlap (every seed of the winner beats every seed
of the runner-up), not significant when they do, not assessed below two seeds each. Levels 0 and
1 repeat one measurement instead of training under seeds: no verdict there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from d500 import levels as _levels
from d500.leaderboard.environments import Legend
from d500.leaderboard.ranking import Board, Entry, comparable, submission_label
from d500.metrics import Metric

TITLE = "Winners"
HEADERS = ["workload", "winner", "ranking figure", "margin over the runner-up", "over seeds"]
SEED_LEVELS = (2, 3)  # board rows aggregate runs of the seeds the rules chose
NOTE = ("the best entry of each workload (rank 1 of its newest rules), its ranking figure, and "
        "how far the runner-up is behind it (× best: how many times worse than the winner, "
        "whichever the metric's direction). Over seeds (levels 2 and 3): significant when the "
        "[min – max] ranges of the two entries' figures over the rules' seeds do not overlap; "
        "levels 0 and 1 repeat one measurement, without seeds. Tables below.")


@dataclass
class Row:
    """One workload (one machine's section of it, when ranked per machine)."""

    board: Board
    workload: str
    winner: str
    figure: str
    margin: str
    seeds: str
    labels: tuple[str, ...] = ()  # the machine's environment labels, when ranked per machine

    @property
    def cells(self) -> list[str]:
        return [self.workload, self.winner, self.figure, self.margin, self.seeds]


def levels(boards: Sequence[Board], legend: Legend | None = None
           ) -> list[tuple[int | None, str, list[Row]]]:
    """(level, level title, rows) per level that has boards, in the leaderboard's order."""
    legend = legend if legend is not None else Legend.of(boards)
    titles = {lvl.number: lvl.title for lvl in _levels.all_levels()} if boards else {}
    grouped: dict[int | None, list[Row]] = {}
    seen: set[tuple] = set()
    for board in boards:  # newest rules version of each workload first (ranking's order)
        key = (board.level, board.workload, board.world_size)
        if key in seen:
            continue
        seen.add(key)
        grouped.setdefault(board.level, []).extend(rows(board, legend))
    out = []
    for number in sorted(grouped, key=lambda n: (n is None, n if n is not None else 0)):
        title = titles.get(number) or (f"level {number}" if number is not None
                                       else "runs without a level")
        out.append((number, title, grouped[number]))
    return out


def rows(board: Board, legend: Legend) -> list[Row]:
    """The board's winner rows: one, or one per machine when it ranks per machine."""
    name = board.workload + (f" · {board.world_size} rank{'s' * (board.world_size != 1)}"
                             if board.world_size else "")
    if board.rank_by is None:
        return [Row(board, name, "—", "unranked: no ranking metric in the recorded rules",
                    "—", "—")]
    groups: dict[str, list[Entry]] = {}
    for e in board.entries:
        groups.setdefault(e.machine if board.per_machine else "", []).append(e)
    out = []
    for group in groups.values():
        labels: tuple[str, ...] = ()
        where = name
        if board.per_machine:
            labels = tuple(dict.fromkeys(lbl for e in group for lbl in legend.labels(e)))
            where = f"{name} (on {', '.join(labels) or 'an unrecorded machine'})"
        out.append(_row(board, where, group, board.rank_by, labels))
    return out


def _row(board: Board, where: str, group: list[Entry], metric: Metric,
         labels: tuple[str, ...]) -> Row:
    ranked = sorted(comparable([e for e in group if e.rank is not None]), key=lambda e: e.rank)
    if not ranked:  # where no run measured the figure at all (`op validate` times nothing), so
        # said: "no ranked entry (latency)" left a user who had only validated guessing why
        why = (f"no run measured {metric.name}" if not any(e.values.get(metric.name)
                                                           for e in group) else metric.name)
        return Row(board, where, "—", f"no ranked entry ({why})", "—", "—", labels)
    best, runner = ranked[0], (ranked[1] if len(ranked) > 1 else None)
    value = best.aggregate.get(metric.name)
    if value is None or not math.isfinite(value):
        return Row(board, where, "—", f"no entry has a finite {metric.name}: every one is "
                   f"{metric.format(value)} (e.g. the target missed)", "—", "—", labels)
    figure = f"{metric.name} {metric.format(value)} ({_how(board, best, metric)}; " \
             f"{metric.direction} is better)" + (
                 " ⚠ every entry was timed on a loaded machine" if best.loaded else "")
    return Row(board, where, name(best), figure, _margin(metric, runner),
               _seeds(board, metric, best, runner), labels)


def name(entry: Entry) -> str:
    return f"{submission_label(entry.submission, entry.package)} / {entry.label}"


def _how(board: Board, entry: Entry, metric: Metric) -> str:
    n = len(entry.values.get(metric.name, []))
    how = "olympic mean" if board.how == "olympic_mean" else "median"
    what = "seed" if board.level in SEED_LEVELS else "run"
    return f"{how} of {n} {what}{'s' * (n != 1)}" if n != 1 else f"1 {what}"


def _margin(metric: Metric, runner: Entry | None) -> str:
    if runner is None:
        return "no runner-up: the only ranked entry"
    value = runner.aggregate.get(metric.name)
    ratio = runner.ratio
    times = "∞" if ratio is not None and math.isinf(ratio) else \
        "—" if ratio is None else f"{ratio:.2f}×"
    tie = " (a tie)" if ratio == 1.0 else ""
    return f"{times}{tie}: runner-up {name(runner)}, {metric.format(value)}"


def _seeds(board: Board, metric: Metric, best: Entry, runner: Entry | None) -> str:
    if board.level not in SEED_LEVELS:
        return "—"
    if runner is None:
        return "no runner-up"
    a, b = best.values.get(metric.name, []), runner.values.get(metric.name, [])
    if min(len(a), len(b)) < 2:
        return (f"not assessed: {len(a)} and {len(b)} seed(s); two or more each are needed")
    spans = f"[{_span(metric, a)}] against [{_span(metric, b)}], n={len(a)} and {len(b)}"
    apart = max(a) < min(b) if metric.lower_is_better else min(a) > max(b)
    if apart:
        return f"significant: every seed of the winner beats every seed of the runner-up " \
               f"({spans})"
    return f"not significant: the seed ranges overlap ({spans})"


def _span(metric: Metric, values: list[float]) -> str:
    return f"{metric.format(min(values), unit=False)} – {metric.format(max(values), unit=False)}"
