"""Leaderboards from the ledger alone: per workload, per (submission, backend), ranked by metric.

Rules come from the workload file's text stored with each run (metrics, rank_by, aggregate):
median with its spread over seeds and repetitions, or MLPerf's olympic mean, never the best run.
A run that missed its target counts as infinite time; failed, diverged, timed-out and interrupted
runs are counted and listed, never hidden. Boards are grouped by level, each level's views above
them. Rows of different hardware are separate entries; machine-dependent figures (times, rates) are
ranked per machine unless across_machines, accuracies and steps to target across machines. Each
distinct environment's provenance is printed once, in a legend (E1, E2, ...) the rows refer to.
Output: Markdown, rich terminal tables, or one self-contained HTML file with PNG plots.

    boards = leaderboard.build(ledger, level=1, across_machines=False)  # ranking: numbers only
    leaderboard.boards_for(ledger, [(1, "mlp-mnist")])       # newest rules of each workload
    console.print(leaderboard.table(board, compact=True))    # terminal.py
    leaderboard.markdown(boards, ledger) / html_page(boards, ledger)
    leaderboard.render(ledger, fmt="md" | "html" | "terminal"); leaderboard.write_html()
    leaderboard.write_markdown("board.md", ledger)           # plots: board-plots/*.png beside it

Markdown and HTML open with the winners of every level (winners.py: per workload the best entry,
its ranking figure, its margin over the runner-up, whether it holds over seeds), then the tables.
The "⚠ loaded machine" mark stands in a row only where it tells the table's rows apart; when
every row carries it, one note under the table says so.

Modules: ranking (boards), environments (hardware identity, machine-dependent metrics, the
legend), text (the words every renderer shares), winners (who won, said first), parts (boards by
level with the levels' views), plots, markdown, html, terminal, output (render/write_html), cli.
"""

from __future__ import annotations

from d500.leaderboard.cli import main
from d500.leaderboard.environments import Legend, machine, machine_dependent
from d500.leaderboard.html import html_page
from d500.leaderboard.markdown import markdown
from d500.leaderboard.output import FORMATS, render, write_html, write_markdown
from d500.leaderboard.parts import Part, parts
from d500.leaderboard.ranking import Board, Entry, boards_for, build
from d500.leaderboard.terminal import plain, renderables, table

__all__ = ["FORMATS", "Board", "Entry", "Legend", "Part", "boards_for", "build", "html_page",
           "machine", "machine_dependent", "main", "markdown", "parts", "plain", "render",
           "renderables", "table", "write_html", "write_markdown"]
