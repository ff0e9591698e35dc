"""d500 check's consistency step on real packages: the digits entry of the shared fixtures (and a
real 2-rank level-3 run) agree with their MLLOGs; a figure, an evaluation's accuracy, a status,
a seed or a hyperparameter forged in the origin ledger and sealed again with the ledger's own
seal function (so the seal chain, `ledger verify` and the package's integrity all pass) is named
by the line that compares it with the log, and so is a time forged in the log's figure line too."""

from __future__ import annotations

import json
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
    is eval_stop - run_start and low subtracts every gap after an earlier eval_stop (the test
    evaluations, off the clock, lie in those gaps)."""
    records = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.splitlines()]
    start = next(r["time_ms"] for r in records if r["key"] == "run_start")
    evals = [i for i, r in enumerate(records) if r["key"] == "eval_accuracy"]
    met = next(n for n, i in enumerate(evals) if records[i]["value"] >= target)
    stops = [next(j for j in range(i, len(records)) if records[j]["key"] == "eval_stop")
             for i in evals]
    gaps = sum(records[j + 1]["time_ms"] - records[j]["time_ms"] for j in stops[:met])
    high = (records[stops[met]]["time_ms"] - start) / 1e3
    return met, high - gaps / 1e3, high


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
    assert problems == [
        f"consistency: run {run}: its seed is 7 but its MLLOG's 'seed' says {seed}",
        (f"consistency: run {run}: hyperparameter lr: recorded 0.01, but its MLLOG logs "
         f"'opt_base_learning_rate' 0.05")]


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
