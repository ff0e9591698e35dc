"""`d500 run`, the main job: a quick suite over the levels that ship (level 0: the example operator
submissions validated and benchmarked; level 1: net check and net bench of a few networks on every
installed backend), recorded in the ledger, then the leaderboard.

Every stage shows a progress bar on stderr; results go to the ledger; at the end the leaderboard
boards of what ran are printed as tables on stdout and the whole leaderboard is written as HTML
under $D500_HOME. Exit 1 when something failed (a backend disagreed, lacked an operator, an
operator failed validation): those runs are recorded as failed and listed, not hidden.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from d500.cli import ArgumentParser, seconds, stdout_console
from d500.errors import D500Error, UsageError
from d500.paths import PROJECT_ROOT

# The default suite: small enough to finish in a few minutes on two cores.
LEVEL0_SUBMISSIONS = PROJECT_ROOT / "submissions"
LEVEL1_DEFAULT = ("light-squeezenet", "light-resnet50", "resnet20-cifar")
LEVEL1_QUICK = ("mlp-mnist",)
BUDGET = 0.5  # seconds of timing per measurement and implementation
QUICK_BUDGET = 0.1
LEVELS = (0, 1)


@dataclass
class Plan:
    """What one `d500 run` does."""

    levels: list[int]
    level0: list[tuple[Path, list[Path]]] = field(default_factory=list)  # submission, cases
    level1: list[Path] = field(default_factory=list)  # workload files
    backends: list[str] | None = None
    budget: float = BUDGET


def main(argv: list[str], prog: str = "d500 run") -> int:
    parser = ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--level", action="append", metavar="N",
                        help="levels to run: 0, 1 or a comma list (default: all that ship)")
    parser.add_argument("--workload", action="append", metavar="NAME",
                        help="only these workloads: a level-0 case name or a level-1 workload "
                             "name or file (repeatable)")
    parser.add_argument("--backends", help="comma-separated backends (default: every installed)")
    parser.add_argument("--quick", action="store_true",
                        help=f"shortest budgets ({QUICK_BUDGET} s) and one small network")
    parser.add_argument("--budget", type=seconds,
                        help=f"seconds of timing per measurement (default {BUDGET})")
    parser.add_argument("--no-html", action="store_true", help="do not write the HTML leaderboard")
    args = parser.parse_args(argv)
    plan = make_plan(args)
    return execute(plan, html=not args.no_html)


# ------------------------------------------------------------------ planning

def _levels(values: list[str] | None) -> list[int]:
    if not values:
        return list(LEVELS)
    out = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if not part.isdigit() or int(part) not in (0, 1, 2, 3):
                raise UsageError(f"--level {part!r}: expected 0, 1, 2 or 3")
            if int(part) not in LEVELS:
                raise UsageError(f"--level {part}: level {part} does not run under d500 run yet "
                                 f"(runs: {', '.join(map(str, LEVELS))})")
            out.append(int(part))
    return sorted(set(out))


def make_plan(args: Any) -> Plan:
    """Resolve levels, workloads and backends up front, so a typo fails before anything runs."""
    from d500.networks import workloads as l1
    from d500.networks.cli import backend_list

    levels = _levels(args.level)
    plan = Plan(levels=levels, budget=args.budget or (QUICK_BUDGET if args.quick else BUDGET))
    if args.backends:
        plan.backends = backend_list(args.backends)
    wanted = list(args.workload or [])
    l0_names = _level0_case_names() if 0 in levels else {}
    matched: set[str] = set()
    if 0 in levels:
        plan.level0 = _plan_level0(wanted, matched)
    if 1 in levels:
        if wanted:
            for w in wanted:
                if w in l0_names:
                    continue
                plan.level1.append(l1.find(w))
                matched.add(w)
        else:
            plan.level1 = [l1.find(n) for n in (LEVEL1_QUICK if args.quick else LEVEL1_DEFAULT)]
        for path in plan.level1:
            l1.load(path)  # validate now
    unknown = [w for w in wanted if w not in matched]
    orphans = [w for w in unknown if w in l0_names]
    if orphans:
        raise UsageError(f"no example submission in {LEVEL0_SUBMISSIONS.name}/ enters the "
                         f"level-0 case '{orphans[0]}'")
    if unknown:
        raise UsageError(f"no workload named '{unknown[0]}' in the selected level(s) "
                         f"{', '.join(map(str, levels))}")
    if not plan.level0 and not plan.level1:
        raise UsageError("nothing to run with this selection")
    return plan


def _level0_case_names() -> dict[str, Path]:
    from d500.operators.workloads import all_cases
    return {c.name: c.path for c in all_cases()}


def _plan_level0(wanted: list[str], matched: set[str]) -> list[tuple[Path, list[Path]]]:
    """Each example submission with the case files it enters (only the wanted ones if any)."""
    from d500.operators.base import load
    from d500.operators.workloads import cases_for

    out = []
    for folder in sorted(p.parent for p in LEVEL0_SUBMISSIONS.glob("*/submission.yaml")):
        loaded = load(str(folder))
        cases = cases_for(loaded.cls.op_type, loaded.workloads)
        if wanted:
            cases = [c for c in cases if c.name in wanted]
            matched.update(c.name for c in cases)
        if cases:
            out.append((folder, [c.path for c in cases]))
    return out


# ------------------------------------------------------------------ running

def execute(plan: Plan, html: bool = True) -> int:
    """Run the plan with progress bars, then print the leaderboard of what ran."""
    from rich.console import Console

    from d500.ledger import Ledger

    err = Console(stderr=True)
    out = stdout_console()
    ledger = Ledger()
    start = time.perf_counter()
    first_id = max((r["id"] for r in ledger.runs()), default=0)
    problems: list[str] = []
    workloads: list[tuple[int, str]] = []
    took: dict[str, float] = {}
    with _progress(err) as progress:
        if plan.level0:
            t0 = time.perf_counter()
            workloads += _run_level0(plan, progress, problems)
            took["level 0"] = time.perf_counter() - t0
        if plan.level1:
            t0 = time.perf_counter()
            workloads += _run_level1(plan, progress, problems, ledger)
            took["level 1"] = time.perf_counter() - t0
    runs = [r for r in ledger.runs() if r["id"] > first_id]
    _print_leaderboard(out, ledger, workloads)
    if html:
        from d500.leaderboard import write_html
        path = write_html(ledger=ledger)
        out.print(f"HTML leaderboard: {path}", highlight=False)
    counts: dict[str, int] = {}
    for r in runs:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    stages = ", ".join(f"{k} {v:.0f} s" for k, v in took.items())
    out.print(f"{len(runs)} runs recorded in {ledger.path} ({summary or 'none'}) in "
              f"{time.perf_counter() - start:.0f} s ({stages})", highlight=False)
    for line in problems:
        out.print(f"[red]problem:[/] {line}", highlight=False)
    return 1 if problems else 0


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
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                               TextColumn, TimeElapsedColumn)
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


def _run_level0(plan: Plan, progress: Callable[[str, int], _Stage],
                problems: list[str]) -> list[tuple[int, str]]:
    """`d500 op bench` of each example submission, one case at a time (its output to a log)."""
    from d500.operators import cli as op_cli
    from d500.operators.workloads import load_case
    from d500.paths import home

    total = sum(len(cases) for _, cases in plan.level0)
    stage = progress("level 0: operators", total)
    log_path = home() / "logs" / f"run-{time.strftime('%Y%m%d-%H%M%S')}-level0.txt"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    done = []
    with log_path.open("w", encoding="utf-8") as log:
        for folder, cases in plan.level0:
            for case_path in cases:
                case = load_case(case_path)
                stage.note(f"{folder.name} on {case.name}")
                argv = ["bench", str(folder), "--case", str(case_path),
                        "--budget", str(plan.budget)]
                if plan.backends:
                    argv += ["--backends", ",".join(plan.backends)]
                buf = io.StringIO()
                try:
                    with contextlib.redirect_stdout(buf):
                        code = op_cli.main(argv, prog="d500 op")
                    if code:
                        problems.append(f"level 0 {folder.name} on {case.name}: exit {code}")
                except D500Error as err:  # recorded as failed runs, shown on the board
                    problems.append(f"level 0 {folder.name} on {case.name}: {err}")
                log.write(f"$ d500 op {' '.join(argv)}\n{buf.getvalue()}\n")
                log.flush()
                done.append((0, case.name))
                stage.advance()
    stage.note("done")
    stage.log(f"level 0: {total} case(s) of {len(plan.level0)} submission(s) benchmarked; "
              f"their reports: {log_path}")
    return done


def _run_level1(plan: Plan, progress: Callable[[str, int], _Stage], problems: list[str],
                ledger: Any) -> list[tuple[int, str]]:
    """`d500 net check` of each workload's model, then `d500 net bench` of the workload."""
    from d500 import backends as _backends
    from d500.networks import inputs
    from d500.networks import workloads as l1
    from d500.networks.bench import bench
    from d500.networks.check import check, record

    names = plan.backends or _backends.installed()
    loaded = [l1.load(p) for p in plan.level1]
    check_stage = progress("level 1: net check", len(loaded) * len(set(names) | {"reference"}))
    done = []
    for wl in loaded:
        model, path = wl.onnx_model(loss=wl.train)
        feeds = inputs.make(model, wl.seed)

        state = {"started": False}

        def step(backend: str, wl: l1.Workload = wl, state: dict = state) -> None:
            if state["started"]:
                check_stage.advance()
            state["started"] = True
            if backend:
                check_stage.note(f"{wl.name} on {backend}")

        report = check(model, feeds, names, model_name=wl.name, seed=wl.seed, progress=step)
        record(report, path, ledger, workload=f"check:{wl.name}")
        done.append((1, f"check:{wl.name}"))
        verdicts = ", ".join(f"{r.backend} {r.verdict}" for r in report.results
                             if r.backend != report.baseline)
        check_stage.log(f"net check {wl.name}: {verdicts} (baseline {report.baseline})")
        if report.exit_code != 0:
            problems.append(f"net check {wl.name}: " + "; ".join(
                f"{r.backend}: {r.verdict} {r.error}".strip() for r in report.results
                if not r.agrees and r.backend != report.baseline))
    check_stage.note("done")
    bench_stage = progress("level 1: net bench", len(loaded))
    for wl in loaded:
        result = bench(wl, names, ledger=ledger, budget=plan.budget,
                       progress=lambda text: bench_stage.note(text.split(": ", 1)[-1]
                                                              if text else ""))
        bench_stage.advance()
        done.append((1, wl.name))
        for r in result.results:
            if r.status != "succeeded":
                problems.append(f"net bench {wl.name} on {r.backend}: {r.error}")
        bench_stage.log(f"net bench {wl.name}: " + ", ".join(
            f"{r.backend} {r.status}" for r in result.results))
    bench_stage.note("done")
    return done


def _print_leaderboard(out: Any, ledger: Any, workloads: list[tuple[int, str]]) -> None:
    """The leaderboard boards of the workloads this run touched, as terminal tables (the full
    boards with provenance: `d500 leaderboard` and the HTML file)."""
    from d500 import leaderboard

    boards = []
    seen = set()
    for level, name in workloads:
        if (level, name) in seen:
            continue
        seen.add((level, name))
        boards.extend(leaderboard.build(ledger, level=level, workload=name)[:1])  # current rules
    for board in boards:
        try:
            table = _board_table(leaderboard, board)
        except Exception:  # noqa: BLE001 - the leaderboard's layout changed: its Markdown then
            out.file.flush()
            sys.stdout.write(leaderboard.markdown([board]))
            continue
        out.print(table)


def _board_table(leaderboard: Any, board: Any) -> Any:
    from rich.table import Table
    from rich.text import Text

    headers = leaderboard._headers(board)
    rows = [leaderboard._row(board, e) for e in board.entries]
    drop = {"tuning trials", "provenance"}
    if all(e.submission == e.backend for e in board.entries):
        drop.add("submission")
    keep = [i for i, h in enumerate(headers) if h not in drop]
    table = Table(title=Text(leaderboard._title(board)),
                  caption=Text(leaderboard._rule_line(board)),
                  title_justify="left", caption_justify="left")
    for i in keep:
        table.add_column(Text(headers[i]), justify="left" if i < 3 else "right")
    for row in rows:  # "(n=…)" repeats the runs column; the full boards keep it
        table.add_row(*[Text(re.sub(r" \(n=\d+\)$", "", row[i])) for i in keep])
    return table
