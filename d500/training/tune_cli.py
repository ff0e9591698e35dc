"""`d500 tune WORKLOAD --submission DIR`: AlgoPerf-style external tuning, S studies of T
quasi-random trials, every trial a ledger run; run the same command again to resume a killed
tuning. Under `mpiexec -n K` the trials are shared among K ranks (rank 0 records them and
prints the summary; the others print only errors)."""

from __future__ import annotations

import contextlib
import json
from typing import Any, NoReturn

from d500.cli import count, stdout_console
from d500.errors import UsageError


def main(argv: list[str], prog: str = "d500 tune") -> int:
    from d500.training import tune_parallel
    from d500.training.console import (
        configure_threads,
        line,
        parser,
        print_whole,
        progress_bar,
        resolve,
    )
    if tune_parallel.launched_by_mpi():
        tune_parallel.share_cores()  # before a framework is imported
    p = parser(prog, __doc__.split("\n\n")[0], levels="levels/2-training/*.yaml")
    p.add_argument("--studies", type=count,
                   help="studies (default: the workload's; another number is an exploration "
                        "d500 check refuses)")
    p.add_argument("--trials", type=count,
                   help="trials per study (default: the workload's; only trials 0..T-1 of "
                        "its T ever score, and d500 check refuses another budget)")
    args = p.parse_args(argv)
    from d500 import backends, progress
    from d500.ledger.lifecycle import trial_label
    from d500.training import score

    workload, entry = resolve(args)  # the cheap checks first: no framework imported yet
    if not workload.tuned:
        raise UsageError(f"{workload.path}: '{workload.name}' is a level-{workload.level} "
                         f"workload, which has no tuning (`d500 tune` tunes level 2; run its "
                         f"seeds with mpiexec -n N d500 train)")
    studies = workload.studies if args.studies is None else args.studies
    trials = workload.trials if args.trials is None else args.trials
    entry.check_tunable(trials)
    # a terminal sees each step from here to the first trial's bar (torch's import: 1-4 s)
    starting = contextlib.ExitStack()
    starting.enter_context(progress.shown(f"{workload.name} / {entry.name} / {args.backend}"))
    try:
        backends.get(args.backend)  # its step names the framework it loads
        progress.step("counting the idle cores")
        configure_threads(args)  # after the cheap checks, before the framework runs anything
        progress.step("opening the studies")
    except BaseException:
        starting.close()
        raise
    out = stdout_console()
    bars: list[Any] = []

    def on_trial(trial: Any) -> Any:
        starting.close()
        if bars:
            bars.pop().__exit__(None, None, None)
        bar = progress_bar(f"{trial_label(trial.study, trial.number)} (of studies "
                           f"0..{studies - 1}, trials 0..{trials - 1})")
        bars.append(bar.__enter__())
        return bar

    try:
        report = tune_parallel.tune(workload, entry, args.backend, studies=studies,
                                    trials=trials, data_dir=args.data, on_trial=on_trial)
    except BaseException as err:
        starting.close()
        while bars:
            bars.pop().__exit__(None, None, None)
        if tune_parallel.running_world() is None:
            raise
        abort(prog, err, tune_parallel.running_world())
    starting.close()  # a resumed tuning with every trial done ran none
    while bars:
        bars.pop().__exit__(None, None, None)
    if report is None:
        return 0  # a worker rank: rank 0 recorded its trials and prints the summary
    ranks = report.ranks if report.world_size > 1 else {}
    from d500.ledger import Ledger
    ledger = Ledger()
    runs = [t["run"] for sid in report.studies for t in ledger.trials(sid)]
    best = score.entries(runs)
    if args.json:
        print(json.dumps({"studies": report.studies, "ran": [
            {"study": t.study, "trial": t.number, "params": t.params, "run_id": r.run_id,
             "status": r.status, "figures": r.figures,
             "rank": ranks.get((t.study, t.number))} for t, r in report.ran],
            "world_size": report.world_size,
            "kept": len(report.kept), "score": best[0].score if best else None,
            "tuning_cost": best[0].tuning_cost if best else None}, indent=1, default=str))
        return 0
    for t, r in report.ran:
        where = f" (rank {ranks[t.study, t.number]})" if (t.study, t.number) in ranks else ""
        print_whole(f"{trial_label(t.study, t.number)} {t.params}{where}: "
                    + line(workload, t.seed, r), out)
    if report.kept:
        print_whole(f"{len(report.kept)} trial(s) already done were kept (resumed)", out)
    if best:
        print_whole(score_line(best[0]), out)  # whole in a pipe or a log: it broke at 160
    return 0


def score_line(e: Any) -> str:
    """"score: ... ; tuning cost ... over N trials; trials: 3 succeeded, 1 missed" of a tuned
    entry (d500.training.score.Entry)."""
    from d500 import metrics
    fmt = metrics.get("time_to_accuracy").format
    studies = f"{len(e.studies)} stud{'y' if len(e.studies) == 1 else 'ies'}"
    counts = ", ".join(f"{n} {status}" for status, n in e.counts().items())
    return (f"score: {fmt(e.score)} (median over {studies} of each study's fastest trial to "
            f"the target); tuning cost {fmt(e.tuning_cost)} over {len(e.trials)} trials; "
            f"trials: {counts}")


def abort(prog: str, err: BaseException, comm: Any) -> NoReturn:
    """End a parallel tuning on every rank after a failure on this one: its one line (a
    traceback for a bug), then MPI_Abort, so no rank waits for this one forever."""
    import socket
    import traceback

    from d500.distributed.faults import end_job
    from d500.errors import D500Error
    where = f"{prog} (rank {comm.Get_rank()} of {comm.Get_size()} on {socket.gethostname()})"
    if isinstance(err, D500Error):
        code, text = err.exit_code, f"error: {err}"
    elif isinstance(err, KeyboardInterrupt):
        code, text = 130, "interrupted"
    else:
        traceback.print_exception(err)
        code, text = 1, f"error: {type(err).__name__}: {err}"
    end_job(comm, f"{where}: {text}", code)
