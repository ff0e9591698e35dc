"""Runs recorded through a Relay (a process without the ledger) and written by
Ledger.import_run: the worker's times, host, provenance, evaluations and MLLOG land in a sealed
row linked to its study trial; verify covers it; bad records and bad input are refused."""

from __future__ import annotations

import json
import pickle
import sqlite3
import time
from pathlib import Path

import pytest

from d500 import mllog
from d500.errors import ConfigError, D500Error
from d500.ledger import Ledger
from d500.ledger.relay import Relay


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def workload(tmp_path: Path) -> Path:
    path = tmp_path / "wl.yaml"
    path.write_text("name: wl\nlevel: 2\nmetrics: [time_to_accuracy, val_accuracy]\n"
                    "rank_by: time_to_accuracy\n")
    return path


def relay_run(tmp_path: Path, study_id: int | None, trial: int | None = 1) -> dict:
    """A finished run recorded in memory, as a worker rank does; returns its record."""
    sub = tmp_path / "entry"
    sub.mkdir(exist_ok=True)
    (sub / "submission.yaml").write_text("name: mine\n")
    relay = Relay()
    with relay.start_run(level=2, workload="wl", submission="mine", backend="torch", seed=7,
                         hyperparameters={"lr": 0.1}, workload_file=workload(tmp_path),
                         submission_files=[sub], study=study_id, trial=trial,
                         group="tune job", rank=1, world_size=2, begin=False) as run:
        assert run.id is None
        run.mllog.event("d500_note", "before begin")
        time.sleep(0.01)
        run.begin()
        run.evaluation(step=10, epoch=1.0, metrics={"val_accuracy": 0.5}, wall_time=0.25)
        run.evaluation(step=20, epoch=2.0, metrics={"val_accuracy": 0.9})
        run.record(figures={"val_accuracy": 0.9})
        run.finish("succeeded", figures={"time_to_accuracy": 0.5}, details={"why": "met"})
    return relay.take()


def test_an_imported_run_is_the_workers_own_sealed_and_verified(home, tmp_path):
    ledger = Ledger()
    study = ledger.start_study("s", level=2, workload="wl", submission="mine", backend="torch",
                               objective="time_to_accuracy")
    record = pickle.loads(pickle.dumps(relay_run(tmp_path, study.id)))  # as MPI carries it
    record["process"] = {**record["process"], "host": "node7", "pid": 4242}
    run_id = ledger.import_run(record)

    run = ledger.get(run_id)
    assert run["status"] == "succeeded" and run["sealed"]
    assert run["started_unix"] == record["started"] and run["stopped_unix"] == record["stopped"]
    assert (run["host"], run["pid"]) == ("node7", 4242)
    assert (run["group"], run["rank"], run["world_size"]) == ("tune job", 1, 2)
    assert (run["study"], run["trial"]) == (study.id, 1)
    assert run["figures"] == {"val_accuracy": 0.9, "time_to_accuracy": 0.5}
    assert run["details"] == {"why": "met"}
    assert run["provenance"]["host"] == record["provenance"]["host"]
    assert (run["evaluations"][0]["step"], run["evaluations"][0]["wall_time"]) == (10, 0.25)
    assert run["evaluations"][1]["wall_time"] > 0
    assert ledger.trials(study.id)[0]["params"] == {"lr": 0.1}

    events = mllog.parse(ledger.resolve_path(run["mllog"]))
    assert events == [({**e, "value": run_id} if e["key"] == "d500_run_id" else e)
                      for e in record["mllog"]]  # the worker's lines, its times, the new id
    keys = [e["key"] for e in events]
    assert keys[0] == "init_start" and keys[-1] == "run_stop"
    assert keys.index("d500_note") < keys.index("init_stop") < keys.index("run_start")
    assert {e["key"]: e["value"] for e in events}["d500_rank"] == 1
    times = [e["time_ms"] for e in events]
    assert times == sorted(times) and times[0] <= record["started"] * 1e3
    assert times[-1] <= record["stopped"] * 1e3 + 1
    assert ledger.verify() == []

    db = sqlite3.connect(ledger.path)  # sealing covers the imported evaluations
    db.execute("UPDATE evaluations SET metrics = ? WHERE run_id = ? AND step = 20",
               (json.dumps({"val_accuracy": 0.99}), run_id))
    db.commit()
    assert any("evaluations changed" in p for p in ledger.verify())


def test_the_next_attempt_of_a_trial_number_and_runs_without_a_study(home, tmp_path):
    ledger = Ledger()
    study = ledger.start_study("s", level=2, workload="wl", submission="mine", backend="torch",
                               objective="time_to_accuracy")
    with study.trial({"lr": 0.1}, trial=1, seed=0) as run:
        run.finish("failed", error="first attempt")
    again = ledger.import_run(relay_run(tmp_path, study.id, trial=1))
    assert [(t["attempt"], t["run"]["id"]) for t in ledger.trials(study.id)][1] == (1, again)
    alone = ledger.import_run(relay_run(tmp_path, None, trial=None))
    assert ledger.get(alone)["study"] is None
    assert ledger.verify() == []


def test_an_exception_in_the_block_is_a_failed_record(home, tmp_path):
    relay = Relay()
    with pytest.raises(RuntimeError), relay.start_run(level=2, workload="wl",
                                                      submission="mine", backend="torch"):
        raise RuntimeError("boom")
    record = relay.take()
    assert record["status"] == "failed" and "boom" in record["error"]
    assert record["mllog"][-1]["key"] == "run_stop"
    with pytest.raises(D500Error, match="holds no finished run"):
        relay.take()


@pytest.mark.parametrize("change, message", [
    ({"relay": 99}, "not a relay record of format 1"),
    ({"status": "running"}, "is not a final status"),
    ({"study": 999}, "names study 999, which the ledger"),
    ({"figures": {"no_such_metric": 1.0}}, "no_such_metric"),
    ({"rank": 2}, "rank 2 needs a world_size above it"),
])
def test_bad_records_are_refused_and_write_nothing(home, tmp_path, change, message):
    ledger = Ledger()
    record = {**relay_run(tmp_path, None), **change}
    with pytest.raises(D500Error, match=message):
        ledger.import_run(record)
    assert ledger.runs() == [] and not (ledger.root / "runs").exists()


def test_a_record_lacking_a_field_is_refused(home, tmp_path):
    record = relay_run(tmp_path, None)
    del record["evaluations"]
    with pytest.raises(D500Error, match="lacks evaluations"):
        Ledger().import_run(record)


def test_the_relay_checks_what_start_run_checks(home, tmp_path):
    relay = Relay()
    with pytest.raises(ConfigError, match="no such submission file"):
        relay.start_run(level=2, workload="wl", submission="mine", backend="torch",
                        submission_files=[tmp_path / "missing.py"])
    with pytest.raises(ConfigError, match="cannot read workload file"):
        relay.start_run(level=2, workload="wl", submission="mine", backend="torch",
                        workload_file=tmp_path / "missing.yaml")
    with relay.start_run(level=2, workload="wl", submission="mine", backend="torch",
                         workload_file=workload(tmp_path)) as run, \
            pytest.raises(D500Error, match="no_such_metric"):
        run.evaluation(metrics={"no_such_metric": 1.0})
    assert relay.take()["status"] == "succeeded"  # the error was caught inside the block
