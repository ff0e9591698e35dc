"""`d500 leaderboard`: parse the options, render the ledger's leaderboard, print or write it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from d500 import progress
from d500.cli import ArgumentParser, stdout_console
from d500.errors import UsageError, did_you_mean
from d500.leaderboard import terminal, text
from d500.leaderboard.output import FORMATS, render, write_html, write_markdown
from d500.leaderboard.ranking import build
from d500.paths import non_empty, output_file, write_output

MARKDOWN = (".md", ".markdown", ".txt", "")  # what --out without --format writes Markdown to


def main(argv: list[str], prog: str = "d500 leaderboard") -> int:
    parser = ArgumentParser(prog=prog, description="Rank recorded runs by the metric "
                            "definitions; reads only the ledger.")
    parser.add_argument("--level", type=int, choices=(0, 1, 2, 3))
    parser.add_argument("--workload")
    parser.add_argument("--format", choices=FORMATS,
                        help="md (default; html where --out names an .html file), html (one "
                        "self-contained file) or terminal (tables)")
    parser.add_argument("--out", metavar="FILE", type=non_empty("a file name"),
                        help="write here (HTML default: "
                        "$D500_HOME/leaderboard.html; Markdown: its plots as PNG files in "
                        "FILE's folder, <stem>-plots/)")
    parser.add_argument("--ledger", metavar="FILE", type=non_empty("a ledger file"),
                        help="a ledger file other than "
                        "$D500_HOME/ledger.sqlite")
    parser.add_argument("--across-machines", action="store_true",
                        help="rank machine-dependent figures (times, rates) of different "
                        "hardware against each other (by default each machine's rows are "
                        "ranked apart; accuracies and steps/epochs to target are always ranked "
                        "across machines)")
    args = parser.parse_args(argv)
    given = args.format is not None
    if args.format is None:  # `--out board.html` is the HTML page, not Markdown in that file
        html = args.out and args.out.lower().endswith((".html", ".htm"))
        args.format = "html" if html else "md"
    if args.out:
        output_file(args.out, f"leaderboard.{'html' if args.format == 'html' else 'md'}")
    if args.out and not given and args.format == "md" and \
            Path(args.out).suffix.lower() not in MARKDOWN:
        raise UsageError(f"{args.out}: --out writes the board as Markdown to a name ending in "
                         f".md and as HTML to one ending in .html (--format md: Markdown to any "
                         f"name)")  # board.pdf got Markdown
    from d500.ledger import Ledger

    ledger = Ledger.open_for_reading(args.ledger)
    try:
        with progress.shown("leaderboard"):  # erased before the board shows
            shown = _made(args, ledger)
    finally:
        ledger.close()
    if isinstance(shown, str):
        sys.stdout.write(shown)
    else:
        console = stdout_console()
        for item in shown:
            console.print(item)
    return 0


def _made(args: Any, ledger: Any) -> str | list[Any]:
    """The board the options ask for, written where --out says: what to print (the text, or
    the terminal's tables, or the line saying where it went)."""
    across = args.across_machines
    if args.workload:
        _check_workload(ledger, args.level, args.workload)
    if args.format == "html":
        return f"wrote {write_html(args.out, ledger, args.level, args.workload, across)}\n"
    if args.format == "md" and args.out:
        path, images = write_markdown(args.out, ledger, args.level, args.workload, across)
        return f"wrote {path}" + (f" and {len(images)} plot(s) in {images[0].parent}"
                                  if images else "") + "\n"
    if args.format == "terminal" and not args.out:
        boards = build(ledger, args.level, args.workload, across)
        return terminal.renderables(boards, ledger, text.source(ledger.path, boards))
    rendered = render(ledger, args.level, args.workload, fmt=args.format,
                      across_machines=across)
    return f"wrote {write_output(args.out, rendered)}\n" if args.out else rendered


def _check_workload(ledger: Any, level: int | None, workload: str) -> None:
    """A --workload the ledger has no run of is a usage error naming the workloads it has (an
    empty ledger's board says that nothing is recorded yet)."""
    if ledger.runs(level=level, workload=workload) or not ledger.runs():
        return
    at = "" if level is None else f" at level {level}"
    recorded = sorted({r["workload"] for r in ledger.runs(level=level)})
    has = f"its workloads{at}: {', '.join(recorded)}" if recorded else f"no run{at} yet"
    hint = did_you_mean(workload, recorded)
    raise UsageError(f"--workload '{workload}': no run of it{at} in {ledger.path} ({has}"
                     + (f"; {hint})" if hint else ")"))
