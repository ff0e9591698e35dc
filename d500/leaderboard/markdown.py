"""The leaderboard as Markdown: first the winners of every level (the best entry per workload, why,
its margin, whether it holds over seeds), then per level its views (tables, notes, PNG plots as
image links to files beside the .md file), then per workload the ranked table (one per machine
when times are ranked per machine), the runs not counted and any integrity problems; last the
legend of environments (E1, E2, ...) that the rows' env column refers to."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from d500.leaderboard import plots, text, winners
from d500.leaderboard.environments import Legend
from d500.leaderboard.parts import parts
from d500.leaderboard.ranking import Board
from d500.levels import View


def markdown(boards: Sequence[Board], ledger: Any = None, source: str = "",
             images: dict[str, bytes] | None = None, folder: str = "plots") -> str:
    """The leaderboard as Markdown tables (levels' views need the `ledger` the boards came
    from; `source` is a line saying where the figures come from). With an `images` dict, each
    plot is an image link `folder/NN-caption.png` (relative to the .md file) and its PNG goes
    into `images` under that path, for the caller to write beside the .md file; without one
    (Markdown printed, not written) each plot is a line naming it."""
    out = ["# d500 leaderboard", ""]
    if source:
        out += [f"_{source}_", ""]
    if not boards:
        out.append(text.NO_RUNS)
    legend = Legend.of(boards)
    if boards:
        out += _winners(boards, legend)
    for part in parts(boards, ledger):
        out += [f"## {part.title}", ""]
        for view in part.views:
            out += _view(view, images, folder)
        for board in part.boards:
            out += _board(board, legend)
    if legend:
        out += _legend(boards, legend)
    return "\n".join(out).rstrip("\n") + "\n"


def _winners(boards: Sequence[Board], legend: Legend) -> list[str]:
    """The winners of every level, above every table (d500.leaderboard.winners)."""
    out = [f"## {winners.TITLE}", "", f"_{_md(winners.NOTE)}_", ""]
    for _, title, rows in winners.levels(boards, legend):
        out += [f"**{_md(title)}**", ""]
        out += _table(winners.HEADERS, [row.cells for row in rows]) + [""]
    return out


def _legend(boards: Sequence[Board], legend: Legend) -> list[str]:
    out = [f"## {text.LEGEND_TITLE}", ""]
    for note in text.legend_notes(list(boards), legend):
        out += [f"_{_md(note)}_", ""]
    return out + _table(["env", "provenance"], text.legend_rows(legend)) + [""]


def _view(view: View, images: dict[str, bytes] | None, folder: str) -> list[str]:
    out = [f"### {view.title}", ""]
    for note in view.notes:
        out += [f"_{_md(note)}_", ""]
    if view.headers:
        out += _table(view.headers, view.rows) + [""]
    for caption, data in view.plots:
        if images is None:
            width, height = plots.png_size(data)
            out += [f"_plot: {_md(caption)} (PNG {width}×{height} px; written beside the file "
                    f"with `--out FILE.md`, or see `--format html`)_", ""]
            continue
        path = f"{folder}/{len(images) + 1:02d}-{_slug(caption)}.png"
        images[path] = data
        alt = _md(caption).replace("[", "(").replace("]", ")")
        out += [f"![{alt}]({quote(path)})", "", f"_{_md(caption)}_", ""]
    return out


def _slug(caption: str) -> str:
    """A file name's worth of a plot's caption: lower-case words joined by hyphens."""
    return "-".join(re.findall(r"[a-z0-9]+", caption.lower()))[:60].rstrip("-") or "plot"


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
        note = text.load_note(entries)
        if note:
            out += ["", f"_{_md(note)}_"]
    unstable = text.unstable_note(board.entries, text.columns(board))
    if unstable:
        out += ["", f"_{_md(unstable)}_"]
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
