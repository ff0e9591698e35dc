"""`d500 run`, the main job: a quick suite over every registered level (each level plans its part
and executes it through its own library, which records in the ledger), then the leaderboard.

Before each level it waits, up to --quiet-wait seconds, for other processes to leave the cores
(what they took is measured on every timed run all the same, and a loaded run is ranked apart).
Every level shows a progress bar on stderr; results go to the ledger; at the end the leaderboard
boards of what ran are printed as tables on stdout and the whole leaderboard is written as HTML
under $D500_HOME. Exit 1 when something failed (a backend disagreed, lacked an operator, an
operator failed validation): those runs are recorded as failed and listed, not hidden.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from d500 import threads
from d500.cli import ArgumentParser, seconds, stdout_console
from d500.errors import D500Error, UsageError
from d500.levels import Context, Item, Level, RunOptions, all_levels

BUDGET = 0.5  # seconds of timing per measurement and implementation
QUICK_BUDGET = 0.1
QUIET_WAIT = 60.0  # seconds a level waits for other processes to leave the cores


@dataclass
class Plan:
    """What one `d500 run` does: each selected level with its planned items."""

    stages: list[tuple[Level, list[Item]]] = field(default_factory=list)
    options: RunOptions = field(default_factory=RunOptions)
    quiet_wait: float = 0.0  # seconds each level waits for a quiet machine (0: none)


def main(argv: list[str], prog: str = "d500 run") -> int:
    parser = ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--level", action="append", metavar="N",
                        help="levels to run: a number or a comma list (default: every "
                             "registered level)")
    parser.add_argument("--workload", action="append", metavar="NAME",
                        help="only these workloads: a workload name or file of the selected "
                             "levels (repeatable)")
    parser.add_argument("--backends", help="comma-separated backends (default: every installed)")
    parser.add_argument("--quick", action="store_true",
                        help=f"shortest budgets ({QUICK_BUDGET} s) and the smallest workloads")
    parser.add_argument("--budget", type=seconds,
                        help=f"seconds of timing per measurement (default {BUDGET})")
    parser.add_argument("--no-html", action="store_true", help="do not write the HTML leaderboard")
    parser.add_argument("--quiet-wait", type=float, default=QUIET_WAIT, metavar="SECONDS",
                        help="before each level, wait up to this long for other processes to "
                             f"leave the cores (default {QUIET_WAIT:.0f}; 0: do not wait); "
                             "runs timed on a loaded machine are ranked apart")
    threads.add_option(parser)
    args = parser.parse_args(argv)
    if not args.quiet_wait >= 0:
        parser.error(f"--quiet-wait: expected seconds >= 0, got {args.quiet_wait}")
    from d500 import backends, progress
    backends.host_plugins()  # a third-party backend's code never runs in the judge's process
    with progress.shown(prog):  # ~11 s at load 6 said nothing before the first bar showed
        progress.step("planning each level's runs")
        plan = make_plan(args)
        plan.quiet_wait = args.quiet_wait
        frameworks = threads.frameworks(plan.options.backends or backends.installed())
        progress.step(f"loading the frameworks to set their threads: {', '.join(frameworks)}")
        threads.configure(args.threads, frameworks)
    return execute(plan, html=not args.no_html)


# ------------------------------------------------------------------ planning

def _levels(values: list[str] | None) -> list[Level]:
    registered = {level.number: level for level in all_levels()}
    if not values:
        return list(registered.values())
    out = {}
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if not part.isdigit() or int(part) not in registered:
                raise UsageError(f"--level {part!r}: expected one of "
                                 f"{', '.join(map(str, registered))}")
            out[int(part)] = registered[int(part)]
    return [out[n] for n in sorted(out)]


def make_plan(args: Any) -> Plan:
    """Ask every selected level for its items up front, so a typo fails before anything runs."""
    from d500 import backends

    options = RunOptions(workloads=list(args.workload or []),
                         backends=(None if args.backends is None  # "": refused, as ","
                                   else backends.select(args.backends)),
                         budget=args.budget or (QUICK_BUDGET if args.quick else BUDGET),
                         quick=args.quick)
    levels = _levels(args.level)
    for wanted in options.workloads:  # a typo before the levels plan (which takes a while)
        if Path(wanted).is_dir() and not any(_knows(level, wanted) for level in levels):
            raise UsageError(f"--workload {wanted}: a folder, where a workload's name or file "
                             f"goes")
        if not any(_knows(level, wanted) for level in levels):
            from d500.errors import did_you_mean
            from d500.levels import all_levels
            elsewhere = [str(lv.number) for lv in all_levels() if lv not in levels
                         and _knows(lv, wanted)]
            hint = (f"it is a workload of level{'s' * (len(elsewhere) > 1)} "
                    f"{' and '.join(elsewhere)}" if elsewhere else
                    did_you_mean(wanted, {f.stem for level in levels
                                          for f in level.workload_files()}))
            raise UsageError(f"no workload named '{wanted}' in the selected level(s) "
                             f"{', '.join(str(level.number) for level in levels)}"
                             f"{' (' + hint + ')' if hint else ''}")
    for name in options.backends or []:  # after the cheap checks: it imports the framework
        if backends.hosted(name):  # its host imports it (d500.networks.hosted)
            if not backends.is_installed(name):
                raise UsageError(f"backend '{name}' is not installed here")
            continue
        backends.get(name)  # not installed: a usage error now, not mid-run
    plan = Plan(options=options)
    for level in levels:
        items = level.plan(options)
        if items:
            plan.stages.append((level, items))
    answered = {w for _, items in plan.stages for item in items for w in item.requested}
    for wanted in options.workloads:
        if wanted in answered:
            continue
        owner = next(level for level in levels if _knows(level, wanted))
        raise UsageError(f"no example entry of {owner.title} enters the workload '{wanted}'")
    if not plan.stages:
        raise UsageError("nothing to run with this selection")
    return plan


def _knows(level: Level, name: str) -> bool:
    from d500.errors import ConfigError
    try:
        level.find(name)
    except ConfigError:
        return False
    return True


# ------------------------------------------------------------------ running

def execute(plan: Plan, html: bool = True) -> int:
    """Run the plan level by level with progress bars, then print the leaderboard of what ran."""
    from rich.console import Console

    from d500.ledger import Ledger
    from d500.paths import home

    err = Console(stderr=True)
    out = stdout_console()
    ledger = Ledger()
    start = time.perf_counter()
    first_id = max((r["id"] for r in ledger.runs()), default=0)
    problems: list[str] = []
    workloads: list[tuple[int, str]] = []
    took: dict[str, float] = {}
    log_path = home() / "logs" / f"run-{time.strftime('%Y%m%d-%H%M%S')}.txt"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with _progress(err) as progress, log_path.open("w", encoding="utf-8") as log:
        for level, items in plan.stages:
            t0 = time.perf_counter()
            stage = progress(level.title, len(items))
            if plan.quiet_wait > 0:
                _quiet(plan.quiet_wait, stage, err)

            def write(text: str) -> None:
                log.write(text.rstrip() + "\n")
                log.flush()

            context = Context(ledger=ledger, note=stage.note, log=write, options=plan.options)
            for item in items:
                stage.note(item.label)
                write(f"== {level.title}: {item.label}")
                try:
                    outcome = level.execute(item, context)
                except D500Error as error:  # recorded as failed runs, shown on the board
                    problems.append(f"{level.title}, {item.label}: {error}")
                    write(f"error: {error}")
                else:
                    problems += outcome.problems
                    if outcome.summary:
                        stage.log(outcome.summary)
                workloads += [(level.number, w) for w in item.workloads]
                stage.advance()
            stage.note("done")
            took[f"level {level.number}"] = time.perf_counter() - t0
    runs = [r for r in ledger.runs() if r["id"] > first_id]
    _print_leaderboard(out, ledger, workloads)
    if html:
        from d500 import progress
        from d500.leaderboard import write_html
        with progress.shown("HTML leaderboard"):
            path = write_html(ledger=ledger)
        out.print(f"HTML leaderboard: {path}", highlight=False)
    counts: dict[str, int] = {}
    for r in runs:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    stages = ", ".join(f"{k} {v:.0f} s" for k, v in took.items())
    out.print(f"{len(runs)} runs recorded in {ledger.path} ({summary or 'none'}) in "
              f"{time.perf_counter() - start:.0f} s ({stages}); details: {log_path}",
              highlight=False, soft_wrap=True)  # whole in a pipe or a log (it broke at 160)
    for line in problems:
        out.print(f"[red]problem:[/] {line}", highlight=False, soft_wrap=True)
    return 1 if problems else 0


def _quiet(limit: float, stage: Any, err: Any) -> None:
    """Wait for a quiet machine before a level is timed; say so when it stayed loaded."""
    from d500.provenance import loaded_share, usable_cores, wait_for_quiet
    said: list[str] = []

    def note(text: str) -> None:  # a log or a pipe sees no bar: the wait said once there (it
        stage.note(text)  # stayed silent up to --quiet-wait's 60 s per level)
        if not err.is_terminal and not said:
            said.append(text)
            err.print(f"{stage.title}: {text}", highlight=False, soft_wrap=True)

    others = wait_for_quiet(limit, note)
    if others is not None and others > loaded_share() * usable_cores():
        err.print(f"the machine stayed loaded for {limit:.0f} s (other processes take "
                  f"{others:.1f} of {usable_cores()} cores): timing anyway; its runs are marked "
                  "loaded and ranked apart", highlight=False, soft_wrap=True)


class _Stage:
    """One progress bar: `advance()` per item, `note(text)` for what runs now."""

    def __init__(self, progress: Any, title: str, total: int):
        self.progress, self.title = progress, title
        self.task = progress.add_task(title, total=total)

    def note(self, text: str) -> None:
        self.progress.update(self.task, description=f"{self.title}: {text}" if text
                             else self.title)

    def advance(self) -> None:
        self.progress.advance(self.task)

    def log(self, text: str) -> None:
        self.progress.console.print(text, highlight=False)


@contextlib.contextmanager
def _progress(console: Any) -> Iterator[Callable[[str, int], _Stage]]:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.table import Column
    # A fixed share of the width for the description, so the bar does not jump as it changes.
    text = TextColumn("{task.description}",
                      table_column=Column(ratio=3, no_wrap=True, overflow="ellipsis"))
    progress = Progress(SpinnerColumn(), text, BarColumn(bar_width=None,
                                                         table_column=Column(ratio=1)),
                        MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                        redirect_stdout=False, redirect_stderr=False, expand=True,
                        refresh_per_second=4)
    with progress:
        yield lambda title, total: _Stage(progress, title, total)


def _print_leaderboard(out: Any, ledger: Any, workloads: list[tuple[int, str]]) -> None:
    """The views and boards (current rules) of the levels and workloads this run touched, as
    compact terminal tables (the full boards with provenance and plots: `d500 leaderboard` and
    the HTML file). A board with no counted run (a level-2 workload that only ran tuning
    trials) is left to its level's views."""
    from d500 import leaderboard
    from d500.leaderboard.terminal import view_renderables

    for part in leaderboard.parts(leaderboard.boards_for(ledger, workloads), ledger):
        for view in part.views:
            for renderable in view_renderables(view):
                out.print(renderable)
        for board in part.boards:
            if any(entry.runs for entry in board.entries):
                out.print(leaderboard.table(board, compact=True))
