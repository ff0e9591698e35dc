"""d500 check's consistency step on real packages: the digits entry of the shared fixtures (and a
real 2-rank level-3 run) agree with their MLLOGs; a figure, an evaluation's accuracy, a status,
a seed or a hyperparameter forged in the origin ledger and sealed again with the ledger's own
seal function (so the seal chain, `ledger verify` and the package's integrity all pass) is named
by the line that compares it with the log, and so is a time forged in the log's figure line too."""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from d500 import mllog
from d500.competition import consistency
from d500.competition.check import check
from d500.competition.export import build
from d500.competition.package import Package
from d500.distributed.launcher import launch_train, mpiexec
from d500.ledger import Ledger, integrity
from d500.paths import examples, rulebook

from .packages import forge_log, repack, reseal

TARGET = 0.97  # digits-mlp's validation target (the fixture's rules keep the rulebook's)


def forge(ledger: Path, edit: Callable[[sqlite3.Connection], int]) -> None:
    """Edit rows of an origin ledger as whoever holds it can (`edit` returns the run it changed),
    then seal that run and every row after it again, in chain order, with the ledger's own seal
    function: the chain reads as if the forged values had been recorded."""
    db = sqlite3.connect(ledger, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        run_id = edit(db)
        (seq,) = db.execute("SELECT chain_seq FROM runs WHERE id = ?", (run_id,)).fetchone()
        later = [r[0] for r in db.execute("SELECT id FROM runs WHERE chain_seq >= ? "
                                          "ORDER BY chain_seq", (seq,))]
        db.execute("UPDATE runs SET chain_seq = NULL, sealed = NULL, prev_hash = NULL, "
                   "row_hash = NULL WHERE chain_seq >= ?", (seq,))
        for rid in later:
            integrity.seal(db, rid)
        db.execute("COMMIT")
    finally:
        db.close()
    with Ledger(ledger) as book:
        assert book.verify() == []  # the ledger's own check passes the forgery


def set_json(db: sqlite3.Connection, run_id: int, column: str, **values: object) -> None:
    data = json.loads(db.execute(f"SELECT {column} FROM runs WHERE id = ?",
                                 (run_id,)).fetchone()[0])
    data.update(values)
    db.execute(f"UPDATE runs SET {column} = ? WHERE id = ?", (json.dumps(data, sort_keys=True),
                                                            run_id))


def evaluations(db: sqlite3.Connection, run_id: int) -> list[tuple[int, float, dict]]:
    """(row id, wall_time, metrics) of a run's evaluations, in order."""
    return [(r[0], r[1], json.loads(r[2])) for r in db.execute(
        "SELECT id, wall_time, metrics FROM evaluations WHERE run_id = ? ORDER BY id", (run_id,))]


def seed_run(ledger: Path) -> int:
    db = sqlite3.connect(ledger)
    try:
        return db.execute("SELECT MIN(id) FROM runs WHERE status = 'succeeded' AND id NOT IN "
                          "(SELECT run_id FROM trials)").fetchone()[0]
    finally:
        db.close()


def checked(ledger: Path, entry_dir: Path, rules_dir: Path, out: Path) -> list[str]:
    """The problems `d500 check` finds in the entry's package built from `ledger`; the build
    itself re-checks every seal and link (export.build), and the package's integrity passes."""
    report = check(Package.open(build(entry_dir, out, ledger)), rules_dir)
    assert not [p for p in report.problems if p.startswith("integrity:")], report.problems
    return report.problems


def test_the_real_digits_package_agrees_with_its_logs(digits_package, rules_dir, run_d500):
    pkg = Package.open(digits_package)
    report = check(pkg, rules_dir)
    assert report.problems == []
    line = next(c for c in report.checked if c.startswith("consistency:"))
    assert line.startswith("consistency: 6 run(s)' figures, evaluations, hyperparameters, seed, "
                           "status and times against their MLLOGs (times within 0.1 s + 2%)")
    statuses = set()
    for run in pkg.runs():  # the module's own entry point, run by run
        records, bad = mllog.parse_text(run.mllog_text)
        text = run.row["workload_text"]
        assert bad == [] and consistency.log_problems(
            run, records, consistency.rules(text, "digits-mlp.yaml")) == []
        statuses.add(run.status)
    assert statuses == {"succeeded", "diverged", "failed"}
    result = run_d500(None, "check", str(digits_package), "--rules", str(rules_dir))
    assert result.returncode == 0 and "checked  consistency: 6 run(s)" in result.stdout


@pytest.mark.parametrize("figure, change", [
    ("time_to_accuracy", lambda v: v / 2),
    ("epochs", lambda v: v - 2),
    ("final_test_accuracy", lambda v: 1.0),
])
def test_a_figure_forged_and_resealed_disagrees_with_the_log(
        figure, change, ledger_copy, entry_dir, rules_dir, tmp_path):
    run = seed_run(ledger_copy)
    db = sqlite3.connect(ledger_copy)
    true = json.loads(db.execute("SELECT figures FROM runs WHERE id = ?",
                                 (run,)).fetchone()[0])[figure]
    db.close()
    forged = change(true)
    forge(ledger_copy, lambda db: set_json(db, run, "figures", **{figure: forged}) or run)
    problems = checked(ledger_copy, entry_dir, rules_dir, tmp_path / "forged.tar.gz")
    mine = [p for p in problems if p.startswith("consistency:")]
    assert f"consistency: run {run}: figure {figure} is {forged!r}, but its MLLOG logs " \
           f"{true!r}" in mine
    if figure == "final_test_accuracy":
        assert f"consistency: run {run}: figure {figure} is {forged!r}, but its last " \
               f"evaluation says {true!r}" in mine
    else:  # what the first evaluation meeting the target in the log says it is
        prefix = f"consistency: run {run}: figure {figure} is {forged!r}, but the first " \
                 f"evaluation meeting the target {TARGET:g} in its MLLOG (eval_accuracy "
        assert any(p.startswith(prefix) and p.endswith(f"(its {figure}: {true!r})")
                   for p in mine), mine
    assert all(p.startswith(f"consistency: run {run}: figure {figure} is ") for p in mine), mine
    others = [p for p in problems if not p.startswith("consistency:")]
    assert all(p.startswith("convergence:") for p in others), others  # fewer epochs: maybe


def _lowest_wall_time(log: str, target: float) -> tuple[int, float, float]:
    """From a log alone: (index, low, high) of the first evaluation meeting `target`, where high
    is eval_stop - run_start, and so is low: the clock pauses for test evaluations only before a
    checkpoint, and the fixture's runs seal none."""
    records = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.splitlines()]
    start = next(r["time_ms"] for r in records if r["key"] == "run_start")
    evals = [i for i, r in enumerate(records) if r["key"] == "eval_accuracy"]
    met = next(n for n, i in enumerate(evals) if records[i]["value"] >= target)
    stops = [next(j for j in range(i, len(records)) if records[j]["key"] == "eval_stop")
             for i in evals]
    high = (records[stops[met]]["time_ms"] - start) / 1e3
    return met, high, high


def test_a_time_forged_in_the_log_too_is_caught_by_the_logs_timestamps(
        ledger_copy, entry_dir, rules_dir, tmp_path):
    """The careful forger: time_to_accuracy halved in the figures, in the wall time of the
    evaluation that met the target and in the log's own time_to_accuracy line, the log's hash
    in the seal updated. The log's run_start and eval_stop times still say how long it took."""
    run = seed_run(ledger_copy)
    log = ledger_copy.parent / "runs" / str(run) / "mllog.txt"
    text = log.read_text()
    met, low, high = _lowest_wall_time(text, TARGET)
    db = sqlite3.connect(ledger_copy)
    true = json.loads(db.execute("SELECT figures FROM runs WHERE id = ?",
                                 (run,)).fetchone()[0])["time_to_accuracy"]
    db.close()
    slack = consistency.TOLERANCE_S + consistency.TOLERANCE_REL * high
    forged = min(true / 2, low - slack - 0.05)  # below anything the log allows
    lines = text.splitlines(keepends=True)
    i = next(i for i, line in enumerate(lines) if '"key": "time_to_accuracy"' in line)
    lines[i] = re.sub(r'"value": [0-9.e+-]+', f'"value": {forged!r}', lines[i])
    log.write_text("".join(lines))

    def edit(db: sqlite3.Connection) -> int:
        set_json(db, run, "figures", time_to_accuracy=forged)
        row_id = evaluations(db, run)[met][0]
        db.execute("UPDATE evaluations SET wall_time = ? WHERE id = ?", (forged, row_id))
        stored = db.execute("SELECT mllog FROM runs WHERE id = ?", (run,)).fetchone()[0]
        db.execute("UPDATE artifacts SET sha256 = ?, bytes = ? WHERE run_id = ? AND path = ?",
                   (integrity.sha256_file(log), log.stat().st_size, run, stored))
        return run

    forge(ledger_copy, edit)
    problems = checked(ledger_copy, entry_dir, rules_dir, tmp_path / "forged-log.tar.gz")
    where = f"its MLLOG puts evaluation {met + 1} {low:.3f}-{high:.3f} s after run_start"
    assert f"consistency: run {run}: figure time_to_accuracy is {forged!r} s (evaluation " \
           f"{met + 1} met the target), but {where} (eval_stop less the test evaluations " \
           f"before it; tolerance {slack:.3f} s)" in problems
    assert any(p.startswith(f"consistency: run {run}: evaluation {met + 1} (epoch ")
               and f"wall_time {forged:.3f} s, but {where}" in p for p in problems), problems
    assert all(p.startswith(f"consistency: run {run}: ") for p in problems), problems


def test_a_forged_evaluation_accuracy_is_caught(ledger_copy, entry_dir, rules_dir, tmp_path):
    run = seed_run(ledger_copy)
    db = sqlite3.connect(ledger_copy)
    (row_id, _, metrics) = evaluations(db, run)[1]
    db.close()
    true = metrics["val_accuracy"]

    def better(db: sqlite3.Connection) -> int:
        db.execute("UPDATE evaluations SET metrics = ? WHERE id = ?",
                   (json.dumps({**metrics, "val_accuracy": 0.99}, sort_keys=True), row_id))
        return run

    forge(ledger_copy, better)
    assert checked(ledger_copy, entry_dir, rules_dir, tmp_path / "eval.tar.gz") == [
        (f"consistency: run {run}: evaluation 2 (epoch 2.0): val_accuracy 0.99, but its "
         f"MLLOG's eval_accuracy says {true!r}")]


def test_a_forged_status_is_caught(ledger_copy, entry_dir, rules_dir, tmp_path):
    """A trial that failed (the entry's bug at step 3) passed off as merely missing its target."""
    db = sqlite3.connect(ledger_copy)
    (run,) = db.execute("SELECT MIN(id) FROM runs WHERE status = 'failed'").fetchone()
    db.close()

    def hide(db: sqlite3.Connection) -> int:
        db.execute("UPDATE runs SET status = 'missed', error = NULL WHERE id = ?", (run,))
        return run

    forge(ledger_copy, hide)
    problems = checked(ledger_copy, entry_dir, rules_dir, tmp_path / "status.tar.gz")
    mine = [p for p in problems if p.startswith("consistency:")]
    assert mine == [(f"consistency: run {run}: status 'missed', but its MLLOG's run_stop "
                     f"says 'failed' (aborted)")]
    # MLPerf's checker now holds the log to a missed run's rules, which it cannot meet either
    assert all(p.startswith(f"logs: run {run} ") for p in problems if p not in mine), problems


def test_a_forged_seed_and_hyperparameter_are_caught(ledger_copy, entry_dir, rules_dir,
                                                     tmp_path):
    run = seed_run(ledger_copy)
    db = sqlite3.connect(ledger_copy)
    (seed,) = db.execute("SELECT seed FROM runs WHERE id = ?", (run,)).fetchone()
    db.close()

    def edit(db: sqlite3.Connection) -> int:
        db.execute("UPDATE runs SET seed = 7 WHERE id = ?", (run,))
        set_json(db, run, "hyperparameters", lr=0.01)
        return run

    forge(ledger_copy, edit)
    problems = checked(ledger_copy, entry_dir, rules_dir, tmp_path / "seed.tar.gz")
    assert [p for p in problems if not p.startswith("completeness:")] == [
        f"consistency: run {run}: its seed is 7 but its MLLOG's 'seed' says {seed}",
        (f"consistency: run {run}: hyperparameter lr: recorded 0.01, but its MLLOG logs "
         f"'opt_base_learning_rate' 0.05")]
    # the rules chose the seed the run logs: without it, a required seed has no run either
    assert [p for p in problems if p.startswith("completeness:")] == [
        f"completeness: digits-mlp (level 2) / torch: required seed(s) {seed} (of the "
        "workload's 2) have no run: the rules choose the seeds (`d500 train` without --seed "
        "runs them)"]


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec beside Python")
def test_a_level3_run_agrees_with_its_log_and_a_forged_figure_does_not(tmp_path):
    """A real 2-rank sync run: its log (global batch 32, micro batch 16, data_parallelism 2,
    samples_count = step x 32) agrees with its record; its `steps` forged and re-sealed is
    named against the log's samples_count of the evaluation that met the target."""
    home = tmp_path / "entrant"
    report = launch_train(rulebook() / "3-distributed" / "digits-mlp.yaml", examples() / "sync",
                          2, extra=["--seed", "0"], env={**os.environ, "D500_HOME": str(home)},
                          timeout=600)
    assert report.runs and report.runs[0]["status"] == "succeeded", report.summary
    ledger, entry = home / "ledger.sqlite", examples() / "sync"
    clean = check(Package.open(build(entry, tmp_path / "sync.tar.gz", ledger)))
    assert not [p for p in clean.problems if p.startswith(("consistency:", "integrity:"))], \
        clean.problems
    assert any(c.startswith("consistency: 1 run(s)") for c in clean.checked), clean.checked
    (run,) = Package.open(tmp_path / "sync.tar.gz").runs()
    assert (run.level, run.world_size, run.hyperparameters["batch_size"]) == (3, 2, 32)
    true = run.figures["steps"]
    forge(ledger, lambda db: set_json(db, run.origin_id, "figures", steps=true - 10)
          or run.origin_id)
    forged = check(Package.open(build(entry, tmp_path / "forged.tar.gz", ledger)))
    mine = [p for p in forged.problems if p.startswith("consistency:")]
    assert f"consistency: run {run.origin_id}: figure steps is {true - 10!r}, but its MLLOG " \
           f"logs {true!r}" in mine
    assert any(p.startswith(f"consistency: run {run.origin_id}: figure steps is {true - 10!r}, "
                            f"but the first evaluation meeting the target {TARGET:g}")
               and p.endswith(f"(its steps: {true!r})") for p in mine), mine
    assert len(mine) == 2, mine


# -- logs and records that are not what the ledger writes ---------------------------------------

def _line_of(text: str, key: str) -> int:
    """The number (from 1) of the log's first line logging `key`."""
    return next(n for n, line in enumerate(text.splitlines(), 1) if f'"key": "{key}"' in line)


def test_a_log_line_without_value_resealed_is_one_problem_line_not_a_traceback(
        digits_package, rules_dir, tmp_path, run_d500):
    """The seed line's "value" removed and the log's hash re-sealed (integrity passes): MLPerf's
    parser fails on the log and d500's reads the line as no record; each is one line naming the
    run (and the line), the seed is then missing from the log; `d500 check` exits 1."""
    pkg = Package.open(digits_package)
    run = next(r for r in pkg.runs() if r.trial is None)
    line = _line_of(run.mllog_text, "seed")

    def drop_value(text: str) -> str:
        lines = text.splitlines(keepends=True)
        lines[line - 1], n = re.subn(r'"value": [^,]+, ', "", lines[line - 1])
        assert n == 1
        return "".join(lines)

    forged = repack(digits_package, tmp_path / "no-value.tar.gz",
                    forge_log(run.origin_id, drop_value))
    member = f"d500-package/runs/{run.origin_id}.mllog.txt"
    assert check(Package.open(forged), rules_dir).problems == [
        (f"logs: run {run.origin_id} ({member}): MLPerf's parser and checker fail on it "
         f"(KeyError: 'value'); line {line} is not an MLLOG record (no 'value')"),
        f"consistency: run {run.origin_id}: its MLLOG line {line} is not an MLLOG record (no "
        f"'value')",
        f"consistency: run {run.origin_id}: its seed {run.seed} is not in its MLLOG (no 'seed' "
        f"line)"]
    result = run_d500(None, "check", str(forged), "--rules", str(rules_dir))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"its MLLOG line {line} is not an MLLOG record (no 'value')" in result.stdout


@pytest.mark.parametrize("change, why", [
    (lambda r: r.pop("value"), "no 'value'"),
    (lambda r: r.pop("key"), "no 'key'"),
    (lambda r: r.update(key=5), "its 'key' is not a string"),
    (lambda r: r.update(time_ms="1700000000000"), "its 'time_ms' is not a finite number"),
    (lambda r: r.update(time_ms=10 ** 400), "its 'time_ms' is not a finite number"),
    (lambda r: r.update(time_ms=True), "its 'time_ms' is not a finite number"),
    (lambda r: r.pop("metadata"), "no 'metadata'"),
    (lambda r: r.update(metadata=[1]), "its 'metadata' is not an object"),
])
def test_a_record_lacking_a_field_of_its_type_is_an_unreadable_line(digits_package, change, why):
    """mllog.parse_text (the one reader of d500 and its checks) on a real log with one line
    changed: that line is named with why, every other line is read as before."""
    run = next(r for r in Package.open(digits_package).runs() if r.status == "succeeded")
    lines = run.mllog_text.splitlines()
    at = _line_of(run.mllog_text, "eval_accuracy")
    record = json.loads(lines[at - 1].split(mllog.TOKEN, 1)[1])
    change(record)
    lines[at - 1] = mllog.TOKEN + json.dumps(record)
    records, bad = mllog.parse_text("\n".join(lines))
    assert bad == [(at, why)]
    assert records == [json.loads(s.split(mllog.TOKEN, 1)[1]) for n, s in
                       enumerate(run.mllog_text.splitlines(), 1) if n != at]
    for text, what in ((mllog.TOKEN + "{not json", "not JSON"), (mllog.TOKEN + "[1, 2]",
                                                                 "not a JSON object"),
                       (mllog.TOKEN + "[" * 100_000, "nested deeper than 64"),
                       (mllog.TOKEN + "[" * 65 + "]" * 65, "nested deeper than 64")):
        assert mllog.parse_text(f"x\n{text}\n")[1] == [(2, what)]


ODD = [None, "x", "inf", [1], {"a": 1}, 10 ** 400, -1, 1e308, True]  # JSON values a sender
# could put anywhere: the checks compare them, never fail on them


def test_odd_values_anywhere_in_a_log_or_record_are_compared_not_crashed_on(digits_package):
    """Every value, and every metadata field, of every line of every real log replaced in turn
    by each odd JSON value; each figure, hyperparameter and evaluation field of the record too:
    log_problems returns lines (a forged figure or hyperparameter always disagrees with the log),
    never raises."""
    from dataclasses import replace
    workload = consistency.rules(
        (rulebook() / "2-training" / "digits-mlp.yaml").read_text(), "digits-mlp.yaml")
    seen = 0
    for run in Package.open(digits_package).runs():
        records, _ = mllog.parse_text(run.mllog_text)
        assert consistency.log_problems(run, records, workload) == []
        for i, odd in ((i, odd) for i in range(len(records)) for odd in ODD):
            changed = [dict(r) for r in records]
            changed[i]["value"] = odd
            assert all(isinstance(p, str) for p in consistency.log_problems(run, changed,
                                                                            workload))
            changed[i] = {**records[i], "metadata": {k: odd for k in records[i]["metadata"]}}
            assert all(isinstance(p, str) for p in consistency.log_problems(run, changed,
                                                                            workload))
            seen += 1
        figures, hyper = run.figures, run.hyperparameters
        for odd in ODD:
            for column, values in (("figures", figures), ("hyperparameters", hyper)):
                other = replace(run, row={**run.row, column: json.dumps({k: odd for k in values})})
                found = consistency.log_problems(other, records, workload)
                assert found or not values or odd == "inf"  # ("inf": how inf is logged)
                assert all(isinstance(p, str) for p in found)
            forged = [replace(run, evaluations=[[*e[:k], odd if k != 3 else json.dumps(
                {"val_accuracy": odd, "test_accuracy": odd}), *e[k + 1:]] for e in
                run.evaluations]) for k in range(5)]
            forged += [replace(run, row={**run.row, column: odd})
                       for column in ("started", "stopped", "world_size", "seed")]
            for other in forged:
                found = consistency.log_problems(other, records, workload)
                assert all(isinstance(p, str) for p in found)
    assert seen > 300


def test_a_run_without_an_mllog_is_listed_as_not_checked(digits_package, rules_dir, tmp_path):
    """A run sealed without a log (its row's mllog empty, as a ledger's run before logs were kept
    would be): nothing to compare its record with, so the consistency step lists it under
    not_checked rather than passing it silently."""
    run = next(r for r in Package.open(digits_package).runs() if r.trial is None)

    def unlogged(found: dict[str, bytes]) -> None:
        member = f"d500-package/runs/{run.origin_id}.mllog.txt"
        del found[member]

        def record(rec: dict) -> None:
            rec["artifacts"] = [a for a in rec["artifacts"] if a[0] != rec["row"]["mllog"]]
            rec["row"]["mllog"], rec["mllog"] = None, None
        reseal(run.origin_id, record=record)(found)

    report = check(Package.open(repack(digits_package, tmp_path / "unlogged.tar.gz", unlogged)),
                   rules_dir)
    assert not [p for p in report.problems if p.startswith(("integrity:", "consistency:"))], \
        report.problems
    assert f"consistency: 1 run(s) without an MLLOG to check their records against (run(s) " \
           f"{run.origin_id})" in report.not_checked
    assert any(c.startswith("consistency: 5 run(s)' figures") for c in report.checked)


# -- each check's own line: a record or log of a real run changed as a forger would -------------

def _seed_record(package: Path) -> tuple[object, list[dict], consistency.Rules]:
    """A succeeded seed run of the package, its log's records and its workload's rules."""
    run = next(r for r in Package.open(package).runs()
               if r.trial is None and r.status == "succeeded")
    records, bad = mllog.parse_text(run.mllog_text)
    assert bad == []
    rules = consistency.rules(run.row["workload_text"], "digits-mlp.yaml")
    assert consistency.log_problems(run, records, rules) == []
    return run, records, rules


def _with(run, figures: dict | None = None, **row: object):
    """The run with its figures and/or row columns replaced."""
    from dataclasses import replace
    if figures is not None:
        row["figures"] = json.dumps(figures)
    return replace(run, row={**run.row, **row})


def _log_figure(records: list[dict], name: str, value: object) -> list[dict]:
    """The records with the figure line `name` (a line with a unit) logging `value`."""
    out = [dict(r) for r in records]
    (i,) = [i for i, r in enumerate(out) if r["key"] == name and "unit" in r["metadata"]]
    out[i]["value"] = value
    return out


def _last_eval(run) -> dict:
    from d500.competition.consistency_training import evaluation
    return evaluation(run.evaluations[-1])


@pytest.mark.parametrize("how", ["after the budget", "never met"])
def test_a_missed_run_with_finite_target_figures_is_caught(digits_package, how):
    """A run that missed its target (met it only after max_seconds, or never), its status,
    run_stop and log all saying so, but time_to_accuracy, epochs and steps left finite in the
    figures and the log's figure lines: a missed run records infinity (`_missed`)."""
    from dataclasses import replace
    run, records, rules = _seed_record(digits_package)
    figures = run.figures
    records = [dict(r) for r in records]
    stop = records[-1]
    assert stop["key"] == mllog.RUN_STOP
    stop["metadata"] = {**stop["metadata"], "d500_status": "missed",
                        mllog.STATUS: mllog.ABORTED}
    if how == "after the budget":
        rules = replace(rules, max_seconds=figures["time_to_accuracy"] / 2)
    else:  # every evaluation below the target, in the log and the record alike
        below = rules.target - 0.1
        for r in records:
            if r["key"] == mllog.EVAL_ACCURACY:
                r["value"] = below
        evals = [[*e[:3], json.dumps({**json.loads(e[3]), "val_accuracy": below}), e[4]]
                 for e in run.evaluations]
        run = replace(run, evaluations=evals)
        figures = {**figures, "val_accuracy": below}
        records = _log_figure(records, "val_accuracy", below)
    missed = _with(run, figures, status="missed")
    problems = consistency.log_problems(missed, records, rules)
    assert problems == [f"run {run.origin_id}: figure {name} is {figures[name]!r}, but a run "
                        "that missed its target records infinity"
                        for name in ("time_to_accuracy", "epochs", "steps")]
    honest = {**figures, **dict.fromkeys(("time_to_accuracy", "epochs", "steps"), math.inf)}
    for name in ("time_to_accuracy", "epochs", "steps"):
        records = _log_figure(records, name, "inf")
    assert consistency.log_problems(_with(missed, honest), records, rules) == []


def test_a_time_to_accuracy_over_the_budget_is_caught(digits_package):
    from dataclasses import replace
    run, records, rules = _seed_record(digits_package)
    tta = run.figures["time_to_accuracy"]
    budget = replace(rules, max_seconds=tta / 2)
    assert consistency.log_problems(run, records, budget) == [
        f"run {run.origin_id}: status 'succeeded', but time_to_accuracy {tta!r} s exceeds the "
        f"budget {tta / 2:g} s"]


def test_a_time_split_longer_than_the_run_is_caught(digits_package):
    """train_time grown past the last evaluation's wall time, samples_per_second made to match
    it, both in the figures and the log's figure lines."""
    run, records, rules = _seed_record(digits_package)
    last = _last_eval(run)
    figures = dict(run.figures)
    figures["train_time"] = last["wall_time"] + 1.0
    figures["samples_per_second"] = last["step"] * 32 / figures["train_time"]
    for name in ("train_time", "samples_per_second"):
        records = _log_figure(records, name, figures[name])
    problems = consistency.log_problems(_with(run, figures), records, rules)
    total = figures["train_time"] + figures["data_time"] + figures["eval_time"]
    assert problems == [
        f"run {run.origin_id}: figures train_time + data_time + eval_time = {total:.6f} s, more "
        f"than the last evaluation's wall time {last['wall_time']:.6f} s (they are parts of it)"]


def test_a_forged_throughput_is_caught(digits_package):
    run, records, rules = _seed_record(digits_package)
    figures = dict(run.figures)
    true = figures["samples_per_second"]
    figures["samples_per_second"] = true * 2
    records = _log_figure(records, "samples_per_second", true * 2)
    last, train = _last_eval(run), figures["train_time"]
    assert consistency.log_problems(_with(run, figures), records, rules) == [
        f"run {run.origin_id}: figure samples_per_second is {true * 2!r}, but its last "
        f"evaluation's step {last['step']} x global batch 32 / train_time {train!r} = "
        f"{last['step'] * 32.0 / train!r}"]


def test_stopped_before_run_stop_and_started_outside_the_log_are_caught(digits_package):
    run, records, rules = _seed_record(digits_package)
    stop_s = records[-1]["time_ms"] / 1e3
    early = stop_s - 1.0
    assert consistency.log_problems(_with(run, stopped=early), records, rules) == [
        f"run {run.origin_id}: stopped at {early:.3f} (unix s), before its MLLOG's run_stop at "
        f"{stop_s:.3f}"]
    low, high = records[0]["time_ms"], records[1]["time_ms"] + 1
    for started in (low / 1e3 - 10, high / 1e3 + 10):
        assert consistency.log_problems(_with(run, started=started), records, rules) == [
            f"run {run.origin_id}: started at {started:.3f} (unix s), but its MLLOG opened it "
            f"between {low / 1e3:.3f} and {high / 1e3:.3f}"]


def test_lines_after_run_stop_are_caught(digits_package):
    run, records, rules = _seed_record(digits_package)
    late = {"key": "d500_note", "value": 1, "time_ms": records[-1]["time_ms"] + 5,
            "metadata": {}, "namespace": "", "event_type": "POINT_IN_TIME"}
    assert consistency.log_problems(run, [*records, late, late], rules) == [
        f"run {run.origin_id}: its MLLOG has 2 line(s) after run_stop"]


def test_a_logged_figure_the_record_lacks_is_caught(digits_package):
    run, records, rules = _seed_record(digits_package)
    figures = dict(run.figures)
    logged = figures.pop("samples_per_second")
    assert consistency.log_problems(_with(run, figures), records, rules) == [
        f"run {run.origin_id}: its MLLOG logs figure samples_per_second = {logged!r}, which its "
        "record lacks"]


def test_a_missed_run_passed_off_with_a_finite_time_is_named_by_check(digits_package, rules_dir,
                                                                      tmp_path):
    """The whole attack through `d500 check`: a seed run made to read as one that never met its
    target (every eval_accuracy below it in the log and the record, status and run_stop
    'missed', everything re-sealed with packages.forge_log and reseal), its time_to_accuracy,
    epochs and steps left finite so that it would score: the consistency step names each."""
    run = next(r for r in Package.open(digits_package).runs()
               if r.trial is None and r.status == "succeeded")
    below = TARGET - 0.2

    def log(text: str) -> str:
        lines = []
        for line in text.splitlines(keepends=True):
            record = json.loads(line.split(mllog.TOKEN, 1)[1])
            if record["key"] == mllog.EVAL_ACCURACY or (record["key"] == "val_accuracy"
                                                        and "unit" in record["metadata"]):
                record["value"] = below
            if record["key"] == mllog.RUN_STOP:
                record["metadata"].update({"d500_status": "missed", mllog.STATUS: mllog.ABORTED})
            lines.append(mllog.TOKEN + json.dumps(record) + "\n")
        return "".join(lines)

    def record(rec: dict) -> None:
        rec["row"]["status"] = "missed"
        for e in rec["evaluations"]:
            e[3] = json.dumps({**json.loads(e[3]), "val_accuracy": below}, sort_keys=True)

    def edit(found: dict[str, bytes]) -> None:
        forge_log(run.origin_id, log)(found)
        reseal(run.origin_id, lambda f: f.update(val_accuracy=below), record)(found)

    forged = repack(digits_package, tmp_path / "missed.tar.gz", edit)
    problems = check(Package.open(forged), rules_dir).problems
    assert not [p for p in problems if p.startswith("integrity:")], problems
    mine = [p for p in problems if p.startswith("consistency:")]
    assert mine == [f"consistency: run {run.origin_id}: figure {name} is {run.figures[name]!r}, "
                    "but a run that missed its target records infinity"
                    for name in ("time_to_accuracy", "epochs", "steps")], problems
