"""The leaderboard as rich tables for a terminal: `table(board)` for one board (compact for the
summary `d500 run` prints), `renderables(...)` for the whole leaderboard with the winners of
every level first and the legend of environments last, `plain(...)` as text. A board ranked per
machine separates each machine's rows by a line and names the machines in its caption. A view's
plots cannot show in a terminal: each is listed by caption and size."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from d500.leaderboard import plots, text, winners
from d500.leaderboard.environments import Legend
from d500.leaderboard.parts import parts
from d500.leaderboard.ranking import Board
from d500.levels import View

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.table import Table


def table(board: Board, compact: bool = False, legend: Legend | None = None) -> Table:
    """One board as a rich Table (title: level and workload; caption: the ranking rule and, for
    rows of several machines, how they compare). `compact` drops the tuning-trials column, the
    env column unless rows come from several machines, the submission column when every
    submission is its backend, and the "(n=…)" that repeats the runs column. Env cells name
    `legend`'s labels (by default a legend of this board alone)."""
    from rich.table import Table
    from rich.text import Text

    legend = legend if legend is not None else Legend.of([board])
    headers = text.headers(board, compact)
    sections = text.sections(board, legend)
    caption = [text.rule_line(board), *text.machine_notes(board)]
    caption += [f"section {i} of {len(sections)}: {heading}"
                for i, (heading, _) in enumerate(sections, 1) if heading]
    env = headers.index("env") if "env" in headers else None
    if env is not None:  # the env column holds labels and a "⚠" where it tells rows apart;
        for _, entries in sections:  # what it means, or (every row loaded) the note, once here
            caption += (text.load_notes(entries) if text.load_separates(entries)
                        else [note for note in [text.load_note(entries)] if note])
    caption += [n for n in [text.unstable_note(board.entries, text.columns(board))] if n]
    out = Table(title=Text(text.title(board)), caption=Text("\n".join(caption)),
                title_justify="left", caption_justify="left")
    for h in headers:
        out.add_column(Text(h), justify="right" if text.numeric(h) else "left")
    for _, entries in sections:  # Text, never markup: "[90.0 – 500.0]" is a spread, not a style
        mark = text.load_separates(entries)
        for i, e in enumerate(entries, 1):
            cells = text.row(board, e, compact, legend)
            if env is not None:
                cells[env] = text.env_cell(e, legend, short=True, mark=mark)
            out.add_row(*[Text(c) for c in cells], end_section=i == len(entries))
    return out


def view_renderables(view: View) -> list[RenderableType]:
    """A level's view: its table (notes as the caption) and one line per plot."""
    from rich.table import Table
    from rich.text import Text

    out: list[RenderableType] = []
    caption = Text(" ".join(view.notes)) if view.notes else None
    if view.headers:
        tab = Table(title=Text(view.title), caption=caption, title_justify="left",
                    caption_justify="left")
        for h in view.headers:
            tab.add_column(Text(h))
        for row in view.rows:
            tab.add_row(*[Text(str(c)) for c in row])
        out.append(tab)
    else:
        out.append(Text(view.title, style="bold"))
        if caption is not None:
            out.append(caption)
    for caption_text, data in view.plots:
        width, height = plots.png_size(data)
        out.append(Text(f"plot: {caption_text} (PNG {width}×{height} px; see --format html)",
                        style="dim"))
    return out


def renderables(boards: Sequence[Board], ledger: Any = None, source: str = ""
                ) -> list[RenderableType]:
    """The whole leaderboard: per level a rule, its views, then its boards in full with their
    runs not counted and integrity problems (levels' views need the `ledger`)."""
    from rich.rule import Rule
    from rich.text import Text

    out: list[RenderableType] = [Text("d500 leaderboard", style="bold")]
    if source:
        out.append(Text(source, style="dim"))
    if not boards:
        out.append(Text(text.NO_RUNS))
    legend = Legend.of(boards)
    if boards:
        out += winners_renderables(boards, legend)
    for part in parts(boards, ledger):
        out.append(Rule(Text(part.title)))
        for view in part.views:
            out += view_renderables(view)
        for board in part.boards:
            out += _board(board, legend)
    if legend:
        out += legend_renderables(boards, legend)
    return out


def winners_renderables(boards: Sequence[Board], legend: Legend) -> list[RenderableType]:
    """The winners of every level, first (d500.leaderboard.winners): one table per level."""
    from rich.rule import Rule
    from rich.table import Table
    from rich.text import Text

    out: list[RenderableType] = [Rule(Text(winners.TITLE))]
    for _, title, rows in winners.levels(boards, legend):
        tab = Table(title=Text(title, style="bold"), title_justify="left")
        for h in winners.HEADERS:
            tab.add_column(Text(h), overflow="fold")
        for row in rows:
            tab.add_row(*(Text(c) for c in row.cells))
        out.append(tab)
    out.append(Text(winners.NOTE, style="dim"))
    return out


def legend_renderables(boards: Sequence[Board], legend: Legend) -> list[RenderableType]:
    """The legend of environments: a rule, its notes and a table of label and provenance."""
    from rich.rule import Rule
    from rich.table import Table
    from rich.text import Text

    tab = Table(caption=Text("\n".join(text.legend_notes(list(boards), legend))),
                caption_justify="left")
    tab.add_column(Text("env"), no_wrap=True)
    tab.add_column(Text("provenance"), overflow="fold")
    for label, prov in text.legend_rows(legend):
        tab.add_row(Text(label), Text(prov))
    return [Rule(Text(text.LEGEND_TITLE)), tab]


def _board(board: Board, legend: Legend) -> list[RenderableType]:
    from rich.table import Table
    from rich.text import Text

    out: list[RenderableType] = []
    if board.version_note:
        out.append(Text(board.version_note, style="dim"))
    out.append(table(board, legend=legend))
    excluded = text.excluded_rows(board)
    if excluded:
        tab = Table(title=Text(f"{text.title(board)}: runs not counted as success "
                               f"({len(excluded)})"), title_justify="left")
        for h in text.EXCLUDED_HEADERS:
            tab.add_column(Text(h))
        for row in excluded:
            tab.add_row(*[Text(c) for c in row])
        out.append(tab)
    problems = text.problems(board)
    if problems:
        out.append(Text("Integrity problems (d500 ledger verify):", style="bold red"))
        out += [Text(f"- {p}", style="red") for p in problems]
    return out


def plain(boards: Sequence[Board], ledger: Any = None, source: str = "", width: int = 160
          ) -> str:
    """`renderables(...)` as plain text (no colour) `width` columns wide, e.g. for a file."""
    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False,
                      highlight=False)
    for item in renderables(boards, ledger, source):
        console.print(item)
    return buf.getvalue()
