"""The leaderboard as one self-contained HTML page: inline CSS, every plot an embedded PNG (data
URI), first the winners of every level (d500.leaderboard.winners: the best entry per workload,
why, its margin and whether it holds over seeds), then per level its views, then per workload
the ranked table (a section per machine when times are ranked per machine), plots, runs not
counted, problems; last the legend of environments that the rows' env cells link to. Readable at
1280 px without horizontal scrolling: tables take the page's width and wrap their cells, images
shrink to fit, and below 800 px rows stack.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from typing import Any

from d500 import progress
from d500.leaderboard import plots, text, winners
from d500.leaderboard.environments import Legend
from d500.leaderboard.parts import parts
from d500.leaderboard.ranking import Board
from d500.levels import View

CSS = """
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;padding:0 1.5em;
max-width:1500px;color:#222;overflow-wrap:break-word}
h1{font-size:1.6em}h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ccc}
h2.level{font-size:1.45em;background:#f4f6fa;padding:.3em .4em;border-bottom:2px solid #9ab}
table{border-collapse:collapse;margin:.6em 0;font-size:.88em;width:100%;max-width:100%}
th,td{border:1px solid #ccc;padding:.3em .45em;text-align:left;vertical-align:top;
overflow-wrap:break-word}
td.env,.legend td,table.wide th,table.wide td{overflow-wrap:anywhere}
table.board,table.view{font-size:.82em}table.board td,table.board th{padding:.25em .35em}
th{background:#f2f2f2;font-weight:600}td.num{text-align:right}
tr.first td{background:#eef8ee}.bad{color:#b00}.ok{color:#070}.note{color:#555;font-size:.9em}
tr.machine th{background:#e8eef6;text-align:left;font-weight:600}
td.env{width:13em}td.env a{color:#1a4f8b}
section.winners{background:#f7faf5;border:1px solid #cdb;padding:.2em 1em .6em;margin:1em 0}
section.winners h2{margin-top:.4em}section.winners h3{margin:.8em 0 .2em;font-size:1.05em}
table.winners td.winner{font-weight:600}table.winners a{color:#1a4f8b}
.legend td:first-child,.legend th:first-child{white-space:nowrap;width:3em;font-weight:600}
figure{margin:.6em 0;max-width:100%}
img{max-width:100%;height:auto;border:1px solid #ddd;margin:.4em 0}
@media (max-width:800px){
table.board thead,table.view thead{display:none}
table.board tr,table.view tr{display:block;border:1px solid #ccc;margin:.4em 0}
table.board td,table.view td{display:block;border:0;text-align:left}
table.board td::before,table.view td::before{content:attr(data-label) ": ";font-weight:600}
tr.machine th{display:block}}
"""

esc = html.escape
WIDE = 16  # columns: past this a table's words may break anywhere (about 70 px a column)


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
    legend = Legend.of(boards)
    found = parts(boards, ledger)
    anchors = {id(b): f"w{i}" for i, b in enumerate(b for p in found for b in p.boards)}
    if boards:
        out += _winners(boards, legend, anchors)
    for part in found:
        anchor = "none" if part.level is None else part.level
        out.append(f"<section class='level' id='level-{anchor}'>"
                   f"<h2 class='level'>{esc(part.title)}</h2>")
        for view in part.views:
            out += _view(view)
        for board in part.boards:
            out += _board(board, ledger, anchors[id(board)], legend)
        out.append("</section>")
    if legend:
        out += _legend(boards, legend)
    out.append("</body></html>")
    return "\n".join(out)


def _winners(boards: Sequence[Board], legend: Legend, anchors: dict[int, str]) -> list[str]:
    """The winners of every level, above every table: per level a table of one row per
    workload (its name a link to its board)."""
    out = [f"<section class='winners' id='winners'><h2>{esc(winners.TITLE)}</h2>",
           f"<p class='note'>{esc(winners.NOTE)}</p>"]
    heads = "".join(f"<th>{esc(h)}</th>" for h in winners.HEADERS)
    for level, title, rows in winners.levels(boards, legend):
        anchor = "none" if level is None else level
        out.append(f"<h3 id='winners-{anchor}'>{esc(title)}</h3>")
        out.append(f"<table class='view winners'><thead><tr>{heads}</tr></thead><tbody>")
        for row in rows:
            tds = []
            for h, c in zip(winners.HEADERS, row.cells, strict=True):
                content = esc(c)
                if h == "workload":
                    content = f"<a href='#{anchors[id(row.board)]}'>{content}</a>"
                klass = " class='winner'" if h == "winner" else ""
                tds.append(f"<td{klass} data-label='{esc(h)}'>{content}</td>")
            out.append("<tr>" + "".join(tds) + "</tr>")
        out.append("</tbody></table>")
    return out + ["</section>"]


def _legend(boards: Sequence[Board], legend: Legend) -> list[str]:
    out = [f"<section class='legend' id='environments'><h2>{esc(text.LEGEND_TITLE)}</h2>"]
    out += [f"<p class='note'>{esc(note)}</p>" for note in text.legend_notes(list(boards), legend)]
    out.append("<table class='legend'><thead><tr><th>env</th><th>provenance</th></tr></thead>"
               "<tbody>")
    out += [f"<tr id='env-{esc(label)}'><td>{esc(label)}</td><td>{esc(prov)}</td></tr>"
            for label, prov in text.legend_rows(legend)]
    return out + ["</tbody></table></section>"]


def _view(view: View) -> list[str]:
    out = [f"<section class='view'><h3>{esc(view.title)}</h3>"]
    out += [f"<p class='note'>{esc(note)}</p>" for note in view.notes]
    if view.headers:
        out.append(_table("view", view.headers, view.rows))
    out += [_figure(caption, data) for caption, data in view.plots]
    return out + ["</section>"]


def _board(board: Board, ledger: Any, anchor: str, legend: Legend | None = None) -> list[str]:
    legend = legend if legend is not None else Legend.of([board])
    out = [f"<section class='workload' id='{anchor}'><h2>{esc(text.title(board))}</h2>"]
    if board.description:
        out.append(f"<p>{esc(board.description)}</p>")
    if board.version_note:
        out.append(f"<p class='note'>{esc(board.version_note)}</p>")
    out.append(f"<p class='note'>{esc(text.rule_line(board))}</p>")
    out += [f"<p class='note machines'>{esc(note)}</p>" for note in text.machine_notes(board)]
    heads = text.headers(board)
    out.append(f"<table class='{_klass('board', heads)}'><thead><tr>" + "".join(
        f"<th>{_breakable(h)}</th>" for h in heads) + "</tr></thead>")
    sections = text.sections(board, legend)
    for heading, entries in sections:
        out.append("<tbody>")
        if heading:
            out.append(f"<tr class='machine'><th colspan='{len(heads)}'>{esc(heading)}</th></tr>")
        for e in entries:
            tds = []
            for h, c in zip(heads, text.row(board, e, legend=legend)):
                klass, tip, content = ("num" if text.numeric(h) else ""), "", esc(c)
                if h == "verify":
                    klass = "ok" if e.verified else "bad"
                    tip = f" title='{esc(' / '.join(e.problems))}'" if e.problems else ""
                elif h == "env":
                    klass, content = "env", _env_links(content)
                tds.append(f"<td class='{klass}' data-label='{esc(h)}'{tip}>{content}</td>")
            first = " class='first'" if e.rank == 1 else ""
            out.append(f"<tr{first}>" + "".join(tds) + "</tr>")
        out.append("</tbody>")
    out.append("</table>")
    for heading, entries in sections:  # a mark every row carries: said once, under the table
        note = text.load_note(entries)
        if note:
            out.append(f"<p class='note loaded'>{esc(heading + ': ' if heading else '')}"
                       f"{esc(note)}</p>")
    unstable = text.unstable_note(board.entries, text.columns(board))
    if unstable:
        out.append(f"<p class='note'>{esc(unstable)}</p>")
    progress.step(f"{text.title(board)}: plots")
    out += [_figure(caption, data) for caption, data in plots.board_plots(board, ledger, legend)]
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
    head = "".join(f"<th>{_breakable(h)}</th>" for h in headers)
    labels = [esc(h) for h in headers] + [""] * max(0, max(map(len, rows), default=0)
                                                     - len(headers))
    body = "".join("<tr>" + "".join(f"<td data-label='{label}'>{esc(str(c))}</td>"
                                    for label, c in zip(labels, row)) + "</tr>"
                   for row in rows)
    return (f"<table class='{_klass(klass, headers)}'><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>")


def _klass(klass: str, headers: Sequence[str]) -> str:
    """The table's class, plus "wide" past WIDE columns: its cells may then break anywhere, so
    the table still fits the page (narrower tables break at spaces, "_" and "/" only)."""
    return f"{klass} wide" if len(headers) > WIDE else klass


def _breakable(header: str) -> str:
    """An escaped header that may wrap after "_" and "/" ("time_to_accuracy (samples/s)")."""
    return re.sub(r"([_/])", r"\1<wbr>", esc(header))


def _env_links(cell: str) -> str:
    """The escaped env cell with each legend label a link to its legend row."""
    return re.sub(r"\bE(\d+)\b", r"<a href='#env-E\1'>E\1</a>", cell)


def _figure(caption: str, data: bytes) -> str:
    plots.png_size(data)  # a level handing over something else is a bug, not a broken page
    uri = "data:image/png;base64," + base64.b64encode(data).decode()
    return (f"<figure><img alt='{esc(caption)}' src='{uri}'>"
            f"<figcaption class='note'>{esc(caption)}</figcaption></figure>")
