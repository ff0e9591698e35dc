"""The leaderboard as Markdown: per level its views (tables, notes, PNG plots inlined as data
URIs), then per workload the ranked table (one per machine when times are ranked per machine),
the runs not counted and any integrity problems; last the legend of environments (E1, E2, ...)
that the rows' env column refers to."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from d500.leaderboard import text
from d500.leaderboard.environments import Legend
from d500.leaderboard.parts import parts
from d500.leaderboard.ranking import Board
from d500.levels import View


def markdown(boards: Sequence[Board], ledger: Any = None, source: str = "") -> str:
    """The leaderboard as Markdown tables (levels' views need the `ledger` the boards came
    from; `source` is a line saying where the figures come from)."""
    out = ["# d500 leaderboard", ""]
    if source:
        out += [f"_{source}_", ""]
    if not boards:
        out.append(text.NO_RUNS)
    legend = Legend.of(boards)
    for part in parts(boards, ledger):
        out += [f"## {part.title}", ""]
        for view in part.views:
            out += _view(view)
        for board in part.boards:
            out += _board(board, legend)
    if legend:
        out += _legend(boards, legend)
    return "\n".join(out).rstrip("\n") + "\n"


def _legend(boards: Sequence[Board], legend: Legend) -> list[str]:
    out = [f"## {text.LEGEND_TITLE}", ""]
    for note in text.legend_notes(list(boards), legend):
        out += [f"_{_md(note)}_", ""]
    return out + _table(["env", "provenance"], text.legend_rows(legend)) + [""]


def _view(view: View) -> list[str]:
    out = [f"### {view.title}", ""]
    for note in view.notes:
        out += [f"_{_md(note)}_", ""]
    if view.headers:
        out += _table(view.headers, view.rows) + [""]
    for caption, data in view.plots:
        alt = _md(caption).replace("[", "(").replace("]", ")")
        out += [f"![{alt}](data:image/png;base64,{base64.b64encode(data).decode()})", "",
                f"_{_md(caption)}_", ""]
    return out


def _board(board: Board, legend: Legend | None = None) -> list[str]:
    legend = legend if legend is not None else Legend.of([board])
    out = [f"### {text.title(board)}", ""]
    if board.version_note:
        out += [f"_{board.version_note}_", ""]
    out += [f"_{_md(text.rule_line(board))}_", ""]
    for note in text.machine_notes(board):
        out += [f"_{_md(note)}_", ""]
    for i, (heading, entries) in enumerate(text.sections(board, legend)):
        if heading:
            out += ([""] if i else []) + [f"**{_md(heading)}**", ""]
        out += _table(text.headers(board), [text.row(board, e, legend=legend) for e in entries])
    excluded = text.excluded_rows(board)
    if excluded:
        out += ["", f"Runs not counted as success ({len(excluded)}):", ""]
        out += _table(text.EXCLUDED_HEADERS, excluded)
    problems = text.problems(board)
    if problems:
        out += ["", "Integrity problems (`d500 ledger verify`):", ""]
        out += [f"- {p}" for p in problems]
    return out + [""]


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(_md(h) for h in headers) + " |",
           "|" + "|".join("---" for _ in headers) + "|"]
    return out + ["| " + " | ".join(_md(str(c)) for c in row) + " |" for row in rows]


def _md(cell: str) -> str:
    return cell.replace("|", "\\|").replace("\n", " ")
