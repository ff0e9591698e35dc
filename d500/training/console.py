"""The terminal side shared by `d500 train` and `d500 tune`: their common arguments, the thread
count they train with, the workload and entry they name (checked against each other), a progress
bar and a result line."""

from __future__ import annotations

import dataclasses
from typing import Any

from d500 import paths, threads
from d500.cli import ArgumentParser
from d500.errors import ConfigError
from d500.training.precision import PRECISIONS


def parser(prog: str, what: str, levels: str = "levels/2-training/*.yaml, at level 3 "
                                               "levels/3-distributed/*.yaml") -> ArgumentParser:
    p = ArgumentParser(prog=prog, description=what)
    p.add_argument("workload", help=f"a workload file ({levels}) or name, looked up at the "
                                    f"entry's level")
    p.add_argument("--submission", required=True, metavar="DIR", type=paths.entry_argument,
                   help="the entry: a folder with submission.yaml, or the name of one of "
                        "d500's example entries (e.g. sgd-momentum)")
    p.add_argument("--backend", default="torch", help="a trainable backend (default torch)")
    paths.add_data_option(p)
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--precision", choices=PRECISIONS,
                   help="what the linear layers compute in, in place of the entry's `precision` "
                        "(fp16: CUDA only; the workload's lowest_precision bounds it)")
    threads.add_option(p, mpi=True)
    return p


def configure_threads(args: Any, recorded: tuple[int, str] | None = None) -> int:
    """Set the one thread count of every framework this command trains with (d500.threads),
    before the framework starts: --threads, else under an MPI launcher each rank's share of its
    host's cores as level 3 gives it (d500.distributed.launch.core_share), else `recorded` (a
    resumed run's count and why), else d500's default. The count goes into every run's
    provenance."""
    from d500.distributed.launch import core_share, launched_by_mpi
    share = core_share() if launched_by_mpi() else recorded
    return threads.configure(args.threads, threads.frameworks([args.backend]), fallback=share)


def resolve(args: Any) -> tuple[Any, Any]:
    """The workload and submission named on the command line, checked against each other (a
    workload name is looked up in the rulebook folder of the entry's level: 2, or 3 when the
    distributed level is registered), a level-2 workload's dataset files present, and the
    results folder (D500_HOME) writable: said before a framework loads or a run starts."""
    from d500 import levels
    from d500.paths import home
    from d500.training import submission as submissions
    entry = submissions.load(args.submission)
    if getattr(args, "precision", None) is not None:  # recorded with every run it makes
        entry.recipe = dataclasses.replace(entry.recipe, precision=args.precision)
    registered = {lv.number for lv in levels.all_levels()}
    level = levels.get(entry.level if entry.level in registered else 2)
    path = level.find(args.workload)
    workload = levels.of_file(path, takes=sorted(registered & {2, 3})).load(path)
    if workload.name not in entry.workloads:
        from d500.errors import did_you_mean
        names = [f.stem for f in level.workload_files()]
        typos = [f"'{w}' is no level-{level.number} workload ({did_you_mean(w, names)})"
                 for w in entry.workloads if w not in names and did_you_mean(w, names)]
        raise ConfigError(f"{entry.path}: the entry does not enter workload '{workload.name}' "
                          f"(field 'workloads': {'; '.join([', '.join(entry.workloads), *typos])})")
    if entry.level != workload.level:
        raise ConfigError(f"{entry.path}: a level-{entry.level} entry cannot run the "
                          f"level-{workload.level} workload '{workload.name}'")
    if workload.level == 2:  # level 3 checks the global batch at the world size it runs at
        entry.recipe.check(workload)
        from d500.training.data.dataset import check_present
        check_present(workload.dataset, args.data)  # its files, before a framework loads
    home()
    return workload, entry


def line(workload: Any, seed_: int, result: Any) -> str:
    """One run's result as one line."""
    from d500 import metrics
    f = result.figures
    parts = [f"run {result.run_id}", f"seed {seed_}", result.status]
    for name in ("time_to_accuracy", "epochs", "val_accuracy", "test_accuracy",
                 "final_test_accuracy", "val_log_perplexity", "test_log_perplexity",
                 "final_test_log_perplexity", "test_perplexity", "samples_per_second"):
        if name in f:
            parts.append(f"{name} {metrics.get(name).format(f[name])}")
    if result.error:
        parts.append(result.error)
    return ", ".join(parts)


def print_whole(text: str, out: Any = None) -> None:
    """A result line on stdout (`out`: a d500.cli.stdout_console), never wrapped: a log or a
    pipe gets 160 columns, and a figure fell apart from its unit on the next line."""
    from d500.cli import stdout_console
    (out or stdout_console()).print(text, highlight=False, soft_wrap=True)


SAY_EVERY = 30.0  # s between a progress bar's plain lines where stderr is no terminal


class progress_bar:  # noqa: N801 - used as a context manager, like a function
    """A rich progress bar on stderr: the step of the total, the loss, the last validation
    accuracy; call it with the trainer's progress dicts. Where stderr is no terminal (a log, a
    pipe, mpiexec's ranks) rich draws it only when it stops, so a line every SAY_EVERY s says
    how far the run is (a 10-minute run's log said nothing until its end), and the bar it drew
    at its end is that plain line instead (squeezed to 80 columns, it read "18… loss 0.0876,
    val acc 0.9233 0:0…"). A plain line says it started, and names no validation figure before
    the last: a log file (`2> log`) is one the entry's code may read while it runs."""

    def __init__(self, title: str):
        import sys
        import time
        self.title, self.started = title, time.monotonic()
        self.said = None if sys.stderr.isatty() else self.started
        self.last = ""  # the last plain line's "step S of T, ..., loss L"
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                                 TimeElapsedColumn(), console=Console(
                                     stderr=True, quiet=self.said is not None),
                                 transient=False)
        self.task = self.progress.add_task(title, total=None, info="")

    def __enter__(self) -> progress_bar:
        self.progress.start()
        if self.said is not None:
            self._say("started")  # (a log said nothing for SAY_EVERY s, mpiexec's ranks ~16)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()
        if self.said is not None:
            self._say(self.last or "before its first step")

    def __call__(self, state: dict[str, Any]) -> None:
        val, what = state.get("val_accuracy"), "val acc"
        if "val_log_perplexity" in state:
            val, what = state["val_log_perplexity"], "val log-ppl"
        loss = f"loss {state['loss']:.4f}"
        info = loss + (f", {what} {val:.4f}" if val is not None else "")
        self.progress.update(self.task, completed=state["step"], total=state["total"],
                             info=info)
        import time
        now = time.monotonic()
        epoch = f", epoch {state['epoch']}" if "epoch" in state else ""
        self.last = f"step {state['step']} of {state['total']}{epoch}, {info}"
        if self.said is not None and now - self.said >= SAY_EVERY:
            self.said = now  # no held-out figure mid-run where it may land in a file the entry's
            self._say(f"step {state['step']} of {state['total']}{epoch}, {loss}")  # code reads

    def _say(self, text: str) -> None:
        import sys
        import time
        sys.stderr.write(f"{self.title}: {text}, {time.monotonic() - self.started:.0f} s\n")
        sys.stderr.flush()
