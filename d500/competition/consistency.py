"""Each packed run's record (figures, evaluations, hyperparameters, seed, status, start and stop
times) checked against its own MLLOG, so that a figure re-sealed by the sender fails unless the log
is forged too, consistently with every figure.

    from d500 import mllog
    from d500.competition.consistency import check, log_problems, rules
    records, bad_lines = mllog.parse_text(run.mllog_text)   # bad_lines: [(line number, why)]
    log_problems(run, records, rules(workload_text, "2-training/digits-mlp.yaml"))  # [] agrees
    check(ctx, report)        # d500 check's step over a package (d500.competition.check)

What every level's log holds (d500.mllog, written by the ledger's Run): the submission
description (benchmark = workload, org = submission, d500_level, d500_backend, d500_run_id = the
run id, world size, rank and group when set), the seed, every hyperparameter under its MLPerf key
(`hyperparameter_key`) before init_stop, run_start, each figure recorded (an event carrying a
`unit`; infinities as the string "inf"), and run_stop with MLPerf's status and d500's
(`d500_status`) as the last line. So at every level: the description and seed match the record,
the logged hyperparameters are exactly the recorded ones (none missing, none extra), the last logged
value of each figure is the recorded one (and nothing recorded is unlogged), run_stop's
d500_status is the run's status (a log without run_stop belongs to an `interrupted` run whose
writer died), and the row's `started` lies between init_start and the description's first line
and its `stopped` after run_stop (a trial's wall time is the tuning cost), and the log's
timestamps never go back. Levels 0 and 1 log nothing more: their figures (errors, latencies)
have no events to compare with.

Training runs (levels 2 and 3) also log their evaluations: consistency_training checks those.
A wall-clock step (NTP) during a run would show as a disagreement of its times.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from d500 import mllog
from d500.competition.completeness import ids
from d500.competition.consistency_training import (
    TOLERANCE_REL,
    TOLERANCE_S,
    Rules,
    Training,
    as_float,
    canon,
    number,
    same,
)
from d500.competition.layout import is_int
from d500.errors import D500Error
from d500.ledger import finite

DESCRIBED = {mllog.SUBMISSION_BENCHMARK: "workload", mllog.SUBMISSION_ORG: "submission",
             "d500_level": "level", "d500_backend": "backend", mllog.SEED: "seed",
             "d500_run_group": "run_group", "d500_rank": "rank",
             "d500_world_size": "world_size", "d500_parent_run": "parent_run"}
OPENING = {mllog.INIT_START, mllog.SUBMISSION_PLATFORM, mllog.SUBMISSION_DIVISION,
           "d500_run_id", *DESCRIBED}
TRAINING_LEVELS = (2, 3)


def check(ctx: Any, report: Any) -> None:
    """d500 check's step (a check.Context and check.Report): every packed run with a log whose
    record and log passed integrity (a run already flagged there is not checked again), each
    against the workload text it recorded (else the rules' file); the runs not checked (flagged,
    or without a log) are listed under not_checked."""
    from d500.competition.check import run_workload
    flagged = {int(m.group(1)) for p in report.problems
               if (m := re.match(r"integrity: run (\d+):", p))}
    files = ctx.pkg.workload_files()
    checked, skipped, unlogged = 0, [], []
    for run in ctx.runs:
        if run.origin_id in flagged or run.mllog_text is None:
            (skipped if run.origin_id in flagged else unlogged).append(run.origin_id)
            continue
        rel = run_workload(run, files)
        text = run.row.get("workload_text")
        try:
            workload = rules(text if text is not None else ctx.rules_text(rel), rel)
        except D500Error as err:
            report.problems.append(f"consistency: run {run.origin_id}: {err}")
            continue
        records, bad = mllog.parse_text(run.mllog_text)
        report.problems += [f"consistency: run {run.origin_id}: its MLLOG line {at} is not an "
                            f"MLLOG record ({why})" for at, why in bad]
        report.problems += [f"consistency: {line}" for line in log_problems(run, records,
                                                                          workload)]
        checked += 1
    report.checked.append(f"consistency: {checked} run(s)' figures, evaluations, hyperparameters,"
                          f" seed, status and times against their MLLOGs (times within "
                          f"{TOLERANCE_S:g} s + {TOLERANCE_REL:.0%})")
    if skipped:
        report.not_checked.append(f"consistency: {len(skipped)} run(s) whose record or log "
                                  f"failed integrity (run(s) {ids(skipped)})")
    if unlogged:
        report.not_checked.append(f"consistency: {len(unlogged)} run(s) without an MLLOG to "
                                  f"check their records against (run(s) {ids(unlogged)})")


def rules(text: str | bytes | None, where: str) -> Rules:
    """The target, time budget and split sizes of a training workload file's text (empty Rules
    for None or a level without them); a malformed file is a ConfigError naming `where`."""
    if text is None:
        return Rules()
    from d500.workload import mapping
    data = mapping(text, where)
    target, budget, split = (data.get(k) if isinstance(data.get(k), Mapping) else {}
                             for k in ("target", "budget", "dataset"))
    train, validation = (split.get(k) for k in ("train", "validation"))
    from d500.training.workloads import QUALITIES
    quality = QUALITIES.get(target.get("metric"), "accuracy")
    if quality != "accuracy":  # a text corpus: its split sizes count documents, not windows,
        from d500.training.data.lm import count_windows  # known where its tokens are pinned
        train, validation = count_windows(split.get("tokens_sha256"),
                                          split.get("context")) or (None, None)
    from d500.training.data.dataset import TEXT
    epochs = budget.get("max_epochs")
    cadence = data.get("evaluation", {"every_epochs": 1})  # the schema's default
    cadence = cadence if isinstance(cadence, Mapping) else {}
    every = [v if is_int(v) and v >= 1 else None for v in (cadence.get("every_epochs"),
                                                            cadence.get("every_steps"))]
    return Rules(number(target.get("value")), number(budget.get("max_seconds")),
                 train if is_int(train) else None, validation if is_int(validation) else None,
                 quality, quality == "log_perplexity", split.get("name") in TEXT,
                 data.get("drop_last", True) is not False, epochs if is_int(epochs) else None,
                 *every)


def log_problems(run: Any, records: list[dict[str, Any]], workload: Rules) -> list[str]:
    """Where a run's record (an ExportedRun) disagrees with its MLLOG's records, one line each
    naming the run and the figure or field (see the module docstring)."""
    out = [*_described(run, records), *_hyperparameters(run, records), *_ends(run, records),
           *_figures(run, records), *_clock(records)]
    if run.level in TRAINING_LEVELS and not (run.rank or run.row.get("parent_run")):
        out += Training(run, records, workload).problems()
    return [f"run {run.origin_id}: {line}" for line in out]


# -- every level --------------------------------------------------------------------------------

def _opening(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lines begin_run wrote: those before init_stop, run_start or run_stop, figures aside."""
    out = []
    for r in records:
        if r["key"] in (mllog.INIT_STOP, mllog.RUN_START, mllog.RUN_STOP):
            break
        if "unit" not in r["metadata"]:
            out.append(r)
    return out


def _described(run: Any, records: list[dict[str, Any]]) -> list[str]:
    """The submission description, seed and run id the log opens with against the record."""
    opening = {}
    for r in _opening(records):
        opening.setdefault(r["key"], r["value"])
    out = []
    for key, column in (*DESCRIBED.items(), ("d500_run_id", "origin_id")):
        want = run.origin_id if column == "origin_id" else run.row.get(column)
        if want is None and key not in opening:
            continue
        if key not in opening:
            out.append(f"its {column} {want!r} is not in its MLLOG (no '{key}' line)")
        elif canon(opening[key]) != canon(want):
            out.append(f"its {column} is {want!r} but its MLLOG's '{key}' says "
                       f"{opening[key]!r}")
    return out


def _hyperparameters(run: Any, records: list[dict[str, Any]]) -> list[str]:
    """The hyperparameters logged before init_stop against the recorded ones, key by key."""
    logged: dict[str, list[str]] = {}
    for r in _opening(records):
        if r["key"] not in OPENING:
            logged.setdefault(r["key"], []).append(canon(r["value"]))
    recorded: dict[str, list[str]] = {}
    names: dict[str, list[str]] = {}
    for name, value in run.hyperparameters.items():
        key = mllog.hyperparameter_key(name)
        recorded.setdefault(key, []).append(canon(value))
        names.setdefault(key, []).append(name)
    out = []
    for key in sorted(set(logged) | set(recorded)):
        have, log = sorted(recorded.get(key, [])), sorted(logged.get(key, []))
        if have != log:
            what = "/".join(names.get(key, [])) or key
            out.append(f"hyperparameter {what}: recorded {', '.join(have) or 'nothing'}, but its "
                       f"MLLOG logs '{key}' {', '.join(log) or 'nowhere'}")
    return out


def _ends(run: Any, records: list[dict[str, Any]]) -> list[str]:
    """run_start and run_stop against the status, started and stopped."""
    out = []
    stops = [i for i, r in enumerate(records) if r["key"] == mllog.RUN_STOP]
    starts = [r for r in records if r["key"] == mllog.RUN_START]
    if len(starts) > 1 or len(stops) > 1:
        out.append(f"its MLLOG has {len(starts)} run_start and {len(stops)} run_stop lines "
                   "(one run logs one of each)")
    if not stops:
        if run.status != "interrupted":
            out.append(f"status '{run.status}', but its MLLOG has no run_stop (only a run whose "
                       "writer died ends without one: interrupted)")
    else:
        meta = records[stops[-1]]["metadata"]
        mlperf = mllog.SUCCESS if run.status == "succeeded" else mllog.ABORTED
        if meta.get("d500_status") != run.status or meta.get(mllog.STATUS) != mlperf:
            out.append(f"status '{run.status}', but its MLLOG's run_stop says "
                       f"'{meta.get('d500_status')}' ({meta.get(mllog.STATUS)})")
        if stops[-1] != len(records) - 1:
            out.append(f"its MLLOG has {len(records) - 1 - stops[-1]} line(s) after run_stop")
        stopped = run.stopped
        if finite(stopped) and stopped * 1e3 < records[stops[-1]]["time_ms"] - TOLERANCE_S * 1e3:
            out.append(f"stopped at {stopped:.3f} (unix s), before its MLLOG's run_stop at "
                       f"{records[stops[-1]]['time_ms'] / 1e3:.3f}")
    if run.status in ("succeeded", "missed", "diverged") and not starts:
        out.append(f"status '{run.status}', but its MLLOG has no run_start")
    started = run.started
    if finite(started) and len(records) >= 2 and records[0]["key"] == mllog.INIT_START:
        low, high = records[0]["time_ms"], records[1]["time_ms"] + 1
        if not low - TOLERANCE_S * 1e3 <= started * 1e3 <= high + TOLERANCE_S * 1e3:
            out.append(f"started at {started:.3f} (unix s), but its MLLOG opened it between "
                       f"{low / 1e3:.3f} and {high / 1e3:.3f}")
    return out


def _clock(records: list[dict[str, Any]]) -> list[str]:
    """The log's timestamps never go back: one process stamps its lines with the wall clock as it
    writes them, in order (none of this machine's 2,407 real MLLOGs went back). A run_start moved
    later alone, the evaluations' times kept, shortened every time the log allows (a 0.278 s
    time to accuracy passed as 0.005 s)."""
    latest = 0
    for n, r in enumerate(records[1:], 1):
        if r["time_ms"] < records[latest]["time_ms"]:
            return [f"its MLLOG's clock goes back: record {n + 1} ({r['key']!r}) is stamped "
                    f"{records[latest]['time_ms'] - r['time_ms']:g} ms before record "
                    f"{latest + 1} ({records[latest]['key']!r}) above it (lines moved or "
                    "re-stamped)"]
        latest = n
    return []


def _figures(run: Any, records: list[dict[str, Any]]) -> list[str]:
    """Each recorded figure against the last value its log's figure line (with a unit) holds."""
    logged = {r["key"]: r["value"] for r in records if "unit" in r["metadata"]}
    figures = run.figures
    out = []
    for name in sorted(set(figures) | set(logged)):
        if name not in logged:
            out.append(f"figure {name} = {figures[name]!r} is not in its MLLOG")
        elif name not in figures:
            out.append(f"its MLLOG logs figure {name} = {logged[name]!r}, which its record lacks")
        elif not same(figures[name], as_float(logged[name])):
            out.append(f"figure {name} is {figures[name]!r}, but its MLLOG logs "
                       f"{logged[name]!r}")
    return out
