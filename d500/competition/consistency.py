"""Each packed run's record (figures, evaluations, hyperparameters, seed, status, start and stop
times) checked against its own MLLOG, so that a figure re-sealed by the sender fails unless the log
is forged too, consistently with every figure.

    from d500.competition.consistency import check, log_problems, parse, rules
    records, bad_lines = parse(run.mllog_text)
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
and its `stopped` after run_stop (a trial's wall time is the tuning cost). Levels 0 and 1 log
nothing more: their figures (errors, latencies) have no events to compare with.

Training runs (levels 2 and 3, but not a level-3 rank's own row) also log the evaluations
(d500.training.trainer, d500.distributed.loop): per evaluation eval_start, eval_accuracy (the
validation accuracy, with epoch_num and samples_count = step x global batch) and eval_stop; then
the test set is evaluated with the run clock paused and the evaluation row written. Checked:
- the evaluation rows pair one to one, in order, with the eval_accuracy events (same epoch,
  val_accuracy equal to the logged value, step x global_batch_size = samples_count); a run that
  failed or was interrupted may have logged one evaluation it did not live to record;
- micro_batch_size (level 2: batch_size; level 3: per_rank_batch_size), data_parallelism (the
  world size), d500_target and train_samples/eval_samples against the workload's rules;
- status, epochs, steps, time_to_accuracy: the first eval_accuracy at or above the workload's
  target decides them as the trainer does (succeeded when its wall time is within max_seconds,
  missed otherwise; epochs = its epoch_num, steps = its samples_count / global batch,
  time_to_accuracy = its evaluation's wall time; infinity when missed); val_accuracy the last
  logged eval_accuracy, final_test_accuracy the last evaluation's test accuracy, test_accuracy
  that of the evaluation meeting the target;
- time: the trainer's clock starts just after run_start is logged and reads its time
  (`wall_time`, time_to_accuracy) just after eval_stop, less the test evaluations, which lie
  between an earlier eval_stop and the next line logged. So each evaluation's wall time must lie
  in [eval_stop - run_start - those gaps, eval_stop - run_start], widened by TOLERANCE_S +
  TOLERANCE_REL x (eval_stop - run_start): log times are whole milliseconds, and the scheduler
  may pause the process between logging a line and reading the clock (the 2 % also covers
  drift between the wall clock and the monotonic one). Its `recorded` time lies between its
  eval_stop and the next line logged;
- the time split and throughput: train_time + data_time + eval_time at most the last
  evaluation's wall time (the trainer's intervals are disjoint parts of it), samples_per_second
  = last evaluation's step x global batch / train_time.
Test accuracies and the training loss are in no log line but the figures': a sender who forges
them must forge those lines and re-seal the log. That remains possible; only `d500 reproduce`
checks the figures themselves.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from d500 import mllog
from d500.errors import D500Error

TOLERANCE_S = 0.1  # seconds: ms rounding and scheduler pauses between a log line and the clock
TOLERANCE_REL = 0.02  # of the interval measured: clock drift, generously
DESCRIBED = {mllog.SUBMISSION_BENCHMARK: "workload", mllog.SUBMISSION_ORG: "submission",
             "d500_level": "level", "d500_backend": "backend", mllog.SEED: "seed",
             "d500_run_group": "run_group", "d500_rank": "rank",
             "d500_world_size": "world_size", "d500_parent_run": "parent_run"}
OPENING = {mllog.INIT_START, mllog.SUBMISSION_PLATFORM, mllog.SUBMISSION_DIVISION,
           "d500_run_id", *DESCRIBED}
TRAINING_LEVELS = (2, 3)
TARGET_FIGURES = ("time_to_accuracy", "epochs", "steps")


@dataclass(frozen=True)
class Rules:
    """What a workload's rules say that its runs' logs must agree with (None: not given)."""

    target: float | None = None
    max_seconds: float | None = None
    train: int | None = None
    validation: int | None = None


def check(ctx: Any, report: Any) -> None:
    """d500 check's step (a check.Context and check.Report): every packed run with a log whose
    record and log passed integrity (a run already flagged there is not checked again), each
    against the workload text it recorded (else the rules' file)."""
    from d500.competition.check import run_workload
    flagged = {int(m.group(1)) for p in report.problems
               if (m := re.match(r"integrity: run (\d+):", p))}
    files = ctx.pkg.workload_files()
    checked, skipped = 0, 0
    for run in ctx.runs:
        if run.mllog_text is None or run.origin_id in flagged:
            skipped += run.mllog_text is not None
            continue
        rel = run_workload(run, files)
        text = run.row.get("workload_text")
        try:
            workload = rules(text if text is not None else ctx.rules_text(rel), rel)
        except D500Error as err:
            report.problems.append(f"consistency: run {run.origin_id}: {err}")
            continue
        records, bad = parse(run.mllog_text)
        report.problems += [f"consistency: run {run.origin_id}: {line}"
                            for line in bad]
        report.problems += [f"consistency: {line}" for line in log_problems(run, records,
                                                                          workload)]
        checked += 1
    report.checked.append(f"consistency: {checked} run(s)' figures, evaluations, hyperparameters,"
                          f" seed, status and times against their MLLOGs (times within "
                          f"{TOLERANCE_S:g} s + {TOLERANCE_REL:.0%})")
    if skipped:
        report.not_checked.append(f"consistency: {skipped} run(s) whose record or log failed "
                                  "integrity")


def rules(text: str | bytes | None, where: str) -> Rules:
    """The target, time budget and split sizes of a training workload file's text (empty Rules
    for None or a level without them); a malformed file is a ConfigError naming `where`."""
    if text is None:
        return Rules()
    from d500.workload import mapping
    data = mapping(text, where)
    target, budget, split = (data.get(k) if isinstance(data.get(k), Mapping) else {}
                             for k in ("target", "budget", "dataset"))
    return Rules(_number(target.get("value")), _number(budget.get("max_seconds")),
                 _count(split.get("train")), _count(split.get("validation")))


def parse(text: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The `:::MLLOG` records of a log's text, in order, and a line for each one unreadable."""
    records, bad = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if mllog.TOKEN not in line:
            continue
        try:
            record = json.loads(line[line.index(mllog.TOKEN) + len(mllog.TOKEN):])
        except ValueError:
            record = None
        if not (isinstance(record, dict) and isinstance(record.get("key"), str)
                and _real(record.get("time_ms")) and isinstance(record.get("metadata"), dict)):
            bad.append(f"its MLLOG line {number} is not an MLLOG record")
            continue
        records.append(record)
    return records, bad


def log_problems(run: Any, records: list[dict[str, Any]], workload: Rules) -> list[str]:
    """Where a run's record (an ExportedRun) disagrees with its MLLOG's records, one line each
    naming the run and the figure or field (see the module docstring)."""
    out = [*_described(run, records), *_hyperparameters(run, records), *_ends(run, records),
           *_figures(run, records)]
    if run.level in TRAINING_LEVELS and not (run.rank or run.row.get("parent_run")):
        out += _Training(run, records, workload).problems()
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
        elif _canon(opening[key]) != _canon(want):
            out.append(f"its {column} is {want!r} but its MLLOG's '{key}' says "
                       f"{opening[key]!r}")
    return out


def _hyperparameters(run: Any, records: list[dict[str, Any]]) -> list[str]:
    logged: dict[str, list[str]] = {}
    for r in _opening(records):
        if r["key"] not in OPENING:
            logged.setdefault(r["key"], []).append(_canon(r["value"]))
    recorded: dict[str, list[str]] = {}
    names: dict[str, list[str]] = {}
    for name, value in run.hyperparameters.items():
        key = mllog.hyperparameter_key(name)
        recorded.setdefault(key, []).append(_canon(value))
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
        if _real(stopped) and stopped * 1e3 < records[stops[-1]]["time_ms"] - TOLERANCE_S * 1e3:
            out.append(f"stopped at {stopped:.3f} (unix s), before its MLLOG's run_stop at "
                       f"{records[stops[-1]]['time_ms'] / 1e3:.3f}")
    if run.status in ("succeeded", "missed", "diverged") and not starts:
        out.append(f"status '{run.status}', but its MLLOG has no run_start")
    started = run.started
    if _real(started) and len(records) >= 2 and records[0]["key"] == mllog.INIT_START:
        low, high = records[0]["time_ms"], records[1]["time_ms"] + 1
        if not low - TOLERANCE_S * 1e3 <= started * 1e3 <= high + TOLERANCE_S * 1e3:
            out.append(f"started at {started:.3f} (unix s), but its MLLOG opened it between "
                       f"{low / 1e3:.3f} and {high / 1e3:.3f}")
    return out


def _figures(run: Any, records: list[dict[str, Any]]) -> list[str]:
    logged = {r["key"]: r["value"] for r in records if "unit" in r["metadata"]}
    figures = run.figures
    out = []
    for name in sorted(set(figures) | set(logged)):
        if name not in logged:
            out.append(f"figure {name} = {figures[name]!r} is not in its MLLOG")
        elif name not in figures:
            out.append(f"its MLLOG logs figure {name} = {logged[name]!r}, which its record lacks")
        elif not _same(figures[name], _float(logged[name])):
            out.append(f"figure {name} is {figures[name]!r}, but its MLLOG logs "
                       f"{logged[name]!r}")
    return out


# -- training runs ----------------------------------------------------------------------------

class _Training:
    """A level-2/3 run's evaluations, target figures and times against its log."""

    def __init__(self, run: Any, records: list[dict[str, Any]], workload: Rules):
        self.run, self.records, self.rules = run, records, workload
        self.first = {}
        for r in records:
            self.first.setdefault(r["key"], r)
        self.evals = [i for i, r in enumerate(records) if r["key"] == mllog.EVAL_ACCURACY]
        self.rows = [_evaluation(e) for e in run.evaluations]
        self.batch = _number((self.first.get(mllog.GLOBAL_BATCH_SIZE) or {}).get("value"))
        self.out: list[str] = []

    def problems(self) -> list[str]:
        self.keys()
        paired = self.pairs()
        if paired:
            self.times()
            self.target()
            self.split()
        return self.out

    def keys(self) -> None:
        """Batch, parallelism, target and split sizes the log states."""
        run, hyper, rules = self.run, self.run.hyperparameters, self.rules
        want = {mllog.MICRO_BATCH_SIZE: hyper.get("per_rank_batch_size",
                                                  hyper.get("batch_size")),
                "d500_target": rules.target, mllog.TRAIN_SAMPLES: rules.train,
                mllog.EVAL_SAMPLES: rules.validation}
        if run.level == 3:
            want["data_parallelism"] = run.world_size or 1
        for key, value in want.items():
            line = self.first.get(key)
            if value is not None and line is not None and not _same(_number(line["value"]),
                                                                    _number(value)):
                self.out.append(f"its MLLOG's '{key}' is {line['value']!r}, but "
                                f"{'its record' if key == mllog.MICRO_BATCH_SIZE else 'the rules'}"
                                f" say {value!r}")

    def pairs(self) -> bool:
        """Evaluation rows against eval_accuracy lines, one to one; False when they cannot pair."""
        rows, evals = self.rows, self.evals
        extra = len(evals) - len(rows)
        if extra < 0 or (extra > 0 and not (extra == 1 and self.run.status in
                                             ("failed", "interrupted", "timeout"))):
            self.out.append(f"{len(rows)} evaluation(s) recorded, but {len(evals)} eval_accuracy "
                            "line(s) in its MLLOG")
            return False
        for n, (row, i) in enumerate(zip(rows, evals, strict=False), 1):
            line = self.records[i]
            epoch, count = (line["metadata"].get(k) for k in (mllog.EPOCH_NUM,
                                                              mllog.SAMPLES_COUNT))
            val = row["metrics"].get("val_accuracy")
            where = f"evaluation {n} (epoch {row['epoch']})"
            if not _same(_number(epoch), row["epoch"]):
                self.out.append(f"{where}: its MLLOG's eval_accuracy {n} is at epoch {epoch}")
            if not _same(val, _number(line["value"])):
                self.out.append(f"{where}: val_accuracy {val!r}, but its MLLOG's eval_accuracy "
                                f"says {line['value']!r}")
            if (self.batch is not None and row["step"] is not None
                    and not _same(_number(count), row["step"] * self.batch)):
                self.out.append(f"{where}: step {row['step']} x global_batch_size "
                                f"{self.batch:g}, but its MLLOG's samples_count is {count}")
        return True

    def bounds(self, n: int) -> tuple[float, float] | None:
        """Seconds from run_start to evaluation n's eval_stop, less the longest the test
        evaluations before it can have taken (low) and as logged (high); None: no such lines."""
        start = self.first.get(mllog.RUN_START)
        stop = self._after(self.evals[n], mllog.EVAL_STOP)
        if start is None or stop is None:
            return None
        paused = 0.0
        for i in self.evals[:n]:
            j = self._after(i, mllog.EVAL_STOP)
            if j is not None and j + 1 < len(self.records):
                paused += self.records[j + 1]["time_ms"] - self.records[j]["time_ms"]
        span = (self.records[stop]["time_ms"] - start["time_ms"]) / 1e3
        return span - paused / 1e3, span

    def _after(self, i: int, key: str) -> int | None:
        return next((j for j in range(i, len(self.records)) if self.records[j]["key"] == key),
                    None)

    def _outside(self, value: float, n: int) -> str | None:
        """Why `value` (seconds on the run clock at evaluation n) is not what the log allows."""
        found = self.bounds(n)
        if found is None or not _real(value):
            return None
        low, high = found
        slack = TOLERANCE_S + TOLERANCE_REL * high
        if low - slack <= value <= high + slack:
            return None
        return (f"its MLLOG puts evaluation {n + 1} {low:.3f}-{high:.3f} s after run_start "
                f"(eval_stop less the test evaluations before it; tolerance {slack:.3f} s)")

    def times(self) -> None:
        for n, row in enumerate(self.rows):
            why = self._outside(row["wall_time"], n)
            if why is not None:
                self.out.append(f"evaluation {n + 1} (epoch {row['epoch']}): wall_time "
                                f"{row['wall_time']:.3f} s, but {why}")
            stop = self._after(self.evals[n], mllog.EVAL_STOP)
            if stop is None or not _real(row["recorded"]):
                continue
            low = self.records[stop]["time_ms"] / 1e3 - TOLERANCE_S
            nxt = self.records[stop + 1]["time_ms"] if stop + 1 < len(self.records) else None
            high = math.inf if nxt is None else (nxt + 1) / 1e3 + TOLERANCE_S
            if not low <= row["recorded"] <= high:
                self.out.append(f"evaluation {n + 1} (epoch {row['epoch']}): recorded at "
                                f"{row['recorded']:.3f} (unix s), outside its MLLOG's "
                                f"eval_stop..next line {low + TOLERANCE_S:.3f}-"
                                f"{high - TOLERANCE_S:.3f}")

    def target(self) -> None:
        """Status and the target figures as the first evaluation meeting the target decides."""
        run, figures, target = self.run, self.run.figures, self.rules.target
        last = self.rows[-1] if self.rows else None
        if last is not None and run.status in ("succeeded", "missed"):
            for name, want in (("val_accuracy", self.records[self.evals[-1]]["value"]),
                               ("final_test_accuracy", last["metrics"].get("test_accuracy"))):
                if name in figures and not _same(figures[name], _number(want)):
                    self.out.append(f"figure {name} is {figures[name]!r}, but its last "
                                    f"evaluation says {want!r}")
        if target is None or run.status not in ("succeeded", "missed"):
            return
        met = next((n for n, i in enumerate(self.evals)
                    if (_number(self.records[i]["value"]) or 0.0) >= target), None)
        if met is None:
            if run.status == "succeeded":
                best = max((_number(self.records[i]["value"]) or 0.0 for i in self.evals),
                           default=None)
                self.out.append(f"status 'succeeded', but no eval_accuracy in its MLLOG reaches "
                                f"the target {target:g} (best {best!r})")
            self._missed(figures)
            return
        row, line = self.rows[met], self.records[self.evals[met]]
        at = f"the first evaluation meeting the target {target:g} in its MLLOG"
        at += f" (eval_accuracy {line['value']!r}) is evaluation {met + 1}, at epoch "
        at += f"{line['metadata'].get(mllog.EPOCH_NUM)}"
        found = self.bounds(met)
        budget = self.rules.max_seconds
        if run.status == "missed" and budget is not None and found is not None \
                and found[1] + TOLERANCE_S + TOLERANCE_REL * found[1] < budget:
            self.out.append(f"status 'missed', but {at}, at most {found[1]:.3f} s into the run "
                            f"by its MLLOG (budget {budget:g} s)")
        if run.status == "missed":
            self._missed(figures)
            return
        count = _number(line["metadata"].get(mllog.SAMPLES_COUNT))
        want = {"epochs": _number(line["metadata"].get(mllog.EPOCH_NUM)),
                "steps": None if count is None or not self.batch else count / self.batch,
                "time_to_accuracy": row["wall_time"],
                "test_accuracy": row["metrics"].get("test_accuracy")}
        for name, value in want.items():
            if name in figures and value is not None and not _same(figures[name], value):
                self.out.append(f"figure {name} is {figures[name]!r}, but {at} (its {name}: "
                                f"{value!r})")
        tta = figures.get("time_to_accuracy")
        why = None if tta is None else self._outside(tta, met)
        if why is not None:
            self.out.append(f"figure time_to_accuracy is {tta!r} s (evaluation {met + 1} met "
                            f"the target), but {why}")
        if budget is not None and _real(tta) and tta > budget:
            self.out.append(f"status 'succeeded', but time_to_accuracy {tta!r} s exceeds the "
                            f"budget {budget:g} s")

    def _missed(self, figures: dict[str, Any]) -> None:
        for name in TARGET_FIGURES:
            if name in figures and figures[name] != math.inf:
                self.out.append(f"figure {name} is {figures[name]!r}, but a run that missed its "
                                "target records infinity")

    def split(self) -> None:
        """Time split and throughput against the last evaluation (succeeded and missed runs)."""
        figures, last = self.run.figures, self.rows[-1] if self.rows else None
        if last is None or self.run.status not in ("succeeded", "missed"):
            return
        parts = [figures.get(k) for k in ("train_time", "data_time", "eval_time")]
        if all(_real(p) for p in parts) and _real(last["wall_time"]) \
                and sum(parts) > last["wall_time"] * (1 + 1e-9) + 1e-9:
            self.out.append(f"figures train_time + data_time + eval_time = {sum(parts):.6f} s, "
                            f"more than the last evaluation's wall time {last['wall_time']:.6f} s "
                            "(they are parts of it)")
        rate, train = figures.get("samples_per_second"), figures.get("train_time")
        if _real(rate) and _real(train) and train > 0 and self.batch and last["step"] is not None:
            want = last["step"] * self.batch / train
            if not math.isclose(rate, want, rel_tol=1e-9):
                self.out.append(f"figure samples_per_second is {rate!r}, but its last "
                                f"evaluation's step {last['step']} x global batch "
                                f"{self.batch:g} / train_time {train!r} = {want!r}")


# -- values -----------------------------------------------------------------------------------

def _evaluation(row: list[Any]) -> dict[str, Any]:
    """An exported evaluation row [step, epoch, wall_time, metrics text, recorded] as a dict."""
    try:
        metrics = json.loads(row[3])
    except (TypeError, ValueError):
        metrics = {}
    return {"step": row[0], "epoch": row[1], "wall_time": row[2],
            "metrics": metrics if isinstance(metrics, dict) else {}, "recorded": row[4]}


def _canon(value: Any) -> str:
    """A value as JSON text, the way the log writes it (non-finite floats as strings)."""
    def plain(v: Any) -> Any:
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, float) and not math.isfinite(v):
            return str(v)
        return v
    return json.dumps(plain(value), sort_keys=True, default=str)


def _float(value: Any) -> Any:
    """A logged number: the strings "inf", "-inf" and "nan" (how the log writes them) as floats."""
    if isinstance(value, str) and value in ("inf", "-inf", "nan"):
        return float(value)
    return value


def _number(value: Any) -> float | None:
    value = _float(value)
    return float(value) if _real(value) or isinstance(value, float) else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _real(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _same(a: Any, b: Any) -> bool:
    """Two recorded numbers equal (both NaN counts as equal; ints and floats compare by value)."""
    a, b = _float(a), _float(b)
    if isinstance(a, bool) or isinstance(b, bool) or not all(
            isinstance(x, (int, float)) for x in (a, b)):
        return False
    return a == b or (math.isnan(a) and math.isnan(b))

