"""The leaderboard end to end: the ledger's boards in the chosen format (Markdown, HTML or
terminal text), or written as the HTML file under $D500_HOME."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from d500.errors import UsageError
from d500.leaderboard import terminal, text
from d500.leaderboard.html import html_page
from d500.leaderboard.markdown import markdown
from d500.leaderboard.ranking import build
from d500.paths import home, write_output

FORMATS = ("md", "html", "terminal")


def render(ledger: Any = None, level: int | None = None, workload: str | None = None,
           fmt: str = "md", across_machines: bool = False) -> str:
    """The leaderboard (optionally one level / workload) as Markdown ("md"), one
    self-contained HTML page ("html") or the terminal tables as plain text ("terminal").
    `across_machines` ranks times and rates of different hardware against each other."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown leaderboard format '{fmt}' (choose from {', '.join(FORMATS)})")
    from d500.ledger import Ledger

    ledger = ledger if ledger is not None else Ledger()
    boards = build(ledger, level, workload, across_machines)
    source = text.source(ledger.path, boards)
    if fmt == "md":
        return markdown(boards, ledger, source)
    if fmt == "html":
        return html_page(boards, ledger, source)
    return terminal.plain(boards, ledger, source)


def write_html(path: str | Path | None = None, ledger: Any = None, level: int | None = None,
               workload: str | None = None, across_machines: bool = False) -> Path:
    """Write the HTML leaderboard (default $D500_HOME/leaderboard.html); returns its path."""
    out = Path(path) if path is not None else home() / "leaderboard.html"
    return write_output(out, render(ledger, level, workload, fmt="html",
                                    across_machines=across_machines))
