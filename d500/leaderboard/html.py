"""The leaderboard as one self-contained HTML page: inline CSS, every plot an embedded PNG (data
URI), per level its views, then per workload the ranked table, plots, runs not counted, problems.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from typing import Any

from d500.leaderboard import plots, text
from d500.leaderboard.parts import parts
from d500.leaderboard.ranking import Board
from d500.levels import View

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em;color:#222}
h1{font-size:1.6em}h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ccc}
h2.level{font-size:1.45em;background:#f4f6fa;padding:.3em .4em;border-bottom:2px solid #9ab}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}
th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#f2f2f2}td.num{text-align:right;white-space:nowrap}
tr.first td{background:#eef8ee}.bad{color:#b00}.ok{color:#070}.note{color:#555;font-size:.9em}
img{max-width:100%;border:1px solid #ddd;margin:.4em 0}
"""

esc = html.escape


def html_page(boards: Sequence[Board], ledger: Any = None, source: str = "") -> str:
    """The leaderboard as one self-contained HTML file (levels' views and the evaluation curves
    need the `ledger` the boards came from)."""
    out = ["<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>",
           "<title>d500 leaderboard</title>", f"<style>{CSS}</style></head><body>",
           "<h1>d500 leaderboard</h1>"]
    if source:
        out.append(f"<p class='note'>{esc(source)}</p>")
    if not boards:
        out.append(f"<p>{esc(text.NO_RUNS)}</p>")
    index = 0
    for part in parts(boards, ledger):
        anchor = "none" if part.level is None else part.level
        out.append(f"<section class='level' id='level-{anchor}'>"
                   f"<h2 class='level'>{esc(part.title)}</h2>")
        for view in part.views:
            out += _view(view)
        for board in part.boards:
            out += _board(board, ledger, f"w{index}")
            index += 1
        out.append("</section>")
    out.append("</body></html>")
    return "\n".join(out)


def _view(view: View) -> list[str]:
    out = [f"<section class='view'><h3>{esc(view.title)}</h3>"]
    out += [f"<p class='note'>{esc(note)}</p>" for note in view.notes]
    if view.headers:
        out.append(_table("view", view.headers, view.rows))
    out += [_figure(caption, data) for caption, data in view.plots]
    return out + ["</section>"]


def _board(board: Board, ledger: Any, anchor: str) -> list[str]:
    out = [f"<section class='workload' id='{anchor}'><h2>{esc(text.title(board))}</h2>"]
    if board.description:
        out.append(f"<p>{esc(board.description)}</p>")
    if board.version_note:
        out.append(f"<p class='note'>{esc(board.version_note)}</p>")
    out.append(f"<p class='note'>{esc(text.rule_line(board))}</p>")
    heads = text.headers(board)
    out.append("<table class='board'><thead><tr>" + "".join(
        f"<th>{esc(h)}</th>" for h in heads) + "</tr></thead><tbody>")
    for e in board.entries:
        tds = []
        for h, c in zip(heads, text.row(board, e)):
            klass, tip = ("num" if text.numeric(h) else ""), ""
            if h == "verify":
                klass = "ok" if e.verified else "bad"
                tip = f" title='{esc(' / '.join(e.problems))}'" if e.problems else ""
            tds.append(f"<td class='{klass}'{tip}>{esc(c)}</td>")
        first = " class='first'" if e.rank == 1 else ""
        out.append(f"<tr{first}>" + "".join(tds) + "</tr>")
    out.append("</tbody></table>")
    out += [_figure(caption, data) for caption, data in plots.board_plots(board, ledger)]
    excluded = text.excluded_rows(board)
    if excluded:
        out.append(f"<h3>Runs not counted as success ({len(excluded)})</h3>")
        out.append(_table("excluded", text.EXCLUDED_HEADERS, excluded))
    problems = text.problems(board)
    if problems:
        out.append("<h3 class='bad'>Integrity problems (d500 ledger verify)</h3><ul>")
        out += [f"<li>{esc(p)}</li>" for p in problems]
        out.append("</ul>")
    return out + ["</section>"]


def _table(klass: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table class='{klass}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(caption: str, data: bytes) -> str:
    plots.png_size(data)  # a level handing over something else is a bug, not a broken page
    uri = "data:image/png;base64," + base64.b64encode(data).decode()
    return (f"<figure><img alt='{esc(caption)}' src='{uri}'>"
            f"<figcaption class='note'>{esc(caption)}</figcaption></figure>")
