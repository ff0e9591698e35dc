"""The leaderboard end to end: the ledger's boards in the chosen format (Markdown, HTML or
terminal text), or written as the HTML file under $D500_HOME, or as a Markdown file with its plots
as PNG files in a folder beside it."""

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


def write_markdown(path: str | Path, ledger: Any = None, level: int | None = None,
                   workload: str | None = None, across_machines: bool = False
                   ) -> tuple[Path, list[Path]]:
    """Write the Markdown leaderboard to `path` and its plots as PNG files in the folder
    `<stem>-plots` beside it, linked from the text by relative path (the folder's PNGs from an
    earlier board are replaced); returns the file and the images."""
    from d500.ledger import Ledger

    path = Path(path)
    ledger = ledger if ledger is not None else Ledger()
    boards = build(ledger, level, workload, across_machines)
    images: dict[str, bytes] = {}
    folder = f"{path.stem}-plots"
    rendered = markdown(boards, ledger, text.source(ledger.path, boards), images, folder)
    written = write_output(path, rendered)
    images_at = path.parent / folder
    try:
        for old in sorted(images_at.glob("*.png")):
            old.unlink()
        if images:
            images_at.mkdir(exist_ok=True)
        for name, data in images.items():
            (path.parent / name).write_bytes(data)
    except OSError as err:
        raise UsageError(f"{images_at}: cannot write the plots there ({err.strerror})") from None
    return written, [path.parent / name for name in images]


def write_html(path: str | Path | None = None, ledger: Any = None, level: int | None = None,
               workload: str | None = None, across_machines: bool = False) -> Path:
    """Write the HTML leaderboard (default $D500_HOME/leaderboard.html); returns its path."""
    out = Path(path) if path is not None else home() / "leaderboard.html"
    return write_output(out, render(ledger, level, workload, fmt="html",
                                    across_machines=across_machines))
