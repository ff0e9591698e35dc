"""The MLLOG event log: JSON line by line, MLPerf's keys, readable by mlperf_logging's tools."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from d500 import mllog
from d500.errors import Diverged
from d500.ledger import Ledger

FIELDS = ["namespace", "time_ms", "event_type", "key", "value", "metadata"]
EVENT_TYPES = {"INTERVAL_START", "INTERVAL_END", "POINT_IN_TIME"}


@pytest.fixture
def ledger(tmp_path, monkeypatch) -> Ledger:
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    return Ledger()


def training_run(ledger: Ledger, epochs: int = 2, diverge: bool = False) -> Path:
    """A small training-shaped run that logs the way a level-2 trainer does."""
    hp = {"batch_size": 32, "lr": 0.05, "momentum": 0.9, "optimizer": "sgd",
          "train_samples": 512, "eval_samples": 128}
    try:
        with ledger.start_run(level=2, workload="mnist-mlp", submission="sgd-momentum",
                              backend="torch", seed=7, hyperparameters=hp) as run:
            log = run.mllog
            for epoch in range(1, epochs + 1):
                log.start(mllog.EPOCH_START, metadata={mllog.EPOCH_NUM: epoch})
                log.end(mllog.EPOCH_STOP, metadata={mllog.EPOCH_NUM: epoch})
                if diverge and epoch == 2:
                    raise Diverged("loss is nan in epoch 2")
                log.start(mllog.EVAL_START, metadata={mllog.EPOCH_NUM: epoch})
                log.event(mllog.EVAL_ACCURACY, 0.5 + 0.1 * epoch,
                          metadata={mllog.EPOCH_NUM: epoch})
                log.end(mllog.EVAL_STOP, metadata={mllog.EPOCH_NUM: epoch})
                run.evaluation(step=epoch * 16, epoch=epoch,
                               metrics={"val_accuracy": 0.5 + 0.1 * epoch})
            run.record(figures={"time_to_accuracy": run.elapsed(), "val_accuracy": 0.7})
    except Diverged:
        pass
    last = ledger.runs()[-1]
    return Path(last["mllog"].replace("$D500_HOME", str(ledger.root)))


def test_log_parses_line_by_line_as_json_with_mlperf_keys(ledger):
    path = training_run(ledger)
    lines = path.read_text().splitlines()
    records = []
    for line in lines:
        assert line.startswith(":::MLLOG ")
        record = json.loads(line[len(":::MLLOG "):])
        assert list(record) == FIELDS
        assert record["event_type"] in EVENT_TYPES
        assert isinstance(record["time_ms"], int) and record["time_ms"] > 1.6e12
        assert record["metadata"]["file"] and isinstance(record["metadata"]["lineno"], int)
        records.append(record)
    keys = [r["key"] for r in records]
    for key in ("submission_benchmark", "submission_org", "submission_platform",
                "submission_division", "init_start", "init_stop", "run_start", "run_stop",
                "epoch_start", "epoch_stop", "eval_start", "eval_stop", "eval_accuracy",
                "seed", "global_batch_size", "opt_base_learning_rate", "opt_momentum",
                "opt_name", "train_samples", "eval_samples", "time_to_accuracy"):
        assert key in keys, key
    by_key = {r["key"]: r for r in records}
    assert keys.index("init_start") < keys.index("init_stop") < keys.index("run_start")
    assert keys[-1] == "run_stop" and by_key["run_stop"]["metadata"]["status"] == "success"
    assert by_key["submission_benchmark"]["value"] == "mnist-mlp"
    assert by_key["seed"]["value"] == 7 and by_key["global_batch_size"]["value"] == 32
    assert by_key["eval_accuracy"]["metadata"]["epoch_num"] == 2
    # the caller's file and line, not the logger's
    assert by_key["eval_accuracy"]["metadata"]["file"] == Path(__file__).name
    assert mllog.parse(path) == records
    assert [a["file"] for a in ledger.get(1)["artifacts"]] == [str(path)]


def test_failed_run_logs_aborted(ledger):
    path = training_run(ledger, epochs=3, diverge=True)
    records = mllog.parse(path)
    assert records[-1]["key"] == "run_stop"
    assert records[-1]["metadata"]["status"] == "aborted"
    assert records[-1]["metadata"]["d500_status"] == "diverged"
    assert not any(r["key"] == "eval_accuracy" and r["metadata"]["epoch_num"] == 2
                   for r in records)


def test_values_json_cannot_hold_are_encoded(tmp_path):
    log = mllog.MLLogger(tmp_path / "x.txt", namespace="rank0")
    log.event("time_to_accuracy", float("inf"))
    log.event("path", tmp_path)
    log.close()
    records = mllog.parse(tmp_path / "x.txt")
    assert records[0]["value"] == "inf" and records[1]["value"] == str(tmp_path)
    assert records[0]["namespace"] == "rank0"
    with pytest.raises(ValueError, match="closed"):
        log.event("late", 1)


def _d500_rules(tmp_path: Path) -> Path:
    """MLPerf Training's own common compliance rules, minus what only an MLPerf organisation
    submission has (cache_clear, submission_status, the per-benchmark follow-up configs)."""
    import mlperf_logging.compliance_checker as cc

    common = Path(cc.__file__).parent / "training_1.0.0" / "common.yaml"
    rules = yaml.safe_load(common.read_text())
    kept = []
    for rule in rules:
        key = rule.get("KEY")
        if key and key["NAME"] in ("cache_clear", "submission_status"):
            continue
        if key and key["NAME"] == "submission_division":
            key.pop("POST", None)  # would enqueue MLPerf's per-benchmark rules
        kept.append(rule)
    path = tmp_path / "d500_common.yaml"
    path.write_text(yaml.safe_dump(kept))
    return path


def test_mlperf_logging_parses_and_checks_the_log(ledger, tmp_path):
    from mlperf_logging.compliance_checker import mlp_compliance, mlp_parser

    path = training_run(ledger)
    loglines, errors = mlp_parser.parse_file(str(path), ruleset="6.1.0")
    assert errors == [] and len(loglines) == len(path.read_text().splitlines())
    rules = _d500_rules(tmp_path)
    checker = mlp_compliance.make_checker("training", "1.0.0", quiet=False, werror=True)
    checker.configured_checks(loglines, str(rules))
    assert not checker.has_messages(), checker.not_overwritable + list(
        checker.overwritable.values())
    # the same tools reject the log of a run killed before run_stop
    truncated = tmp_path / "truncated.txt"
    truncated.write_text("".join(line + "\n" for line in path.read_text().splitlines()
                                 if '"run_stop"' not in line))
    loglines, errors = mlp_parser.parse_file(str(truncated), ruleset="6.1.0")
    checker = mlp_compliance.make_checker("training", "1.0.0", quiet=False, werror=True)
    checker.configured_checks(loglines, str(rules))
    assert checker.has_messages()
    assert "run_stop" in " ".join([*checker.not_overwritable, *checker.overwritable.values()])


def test_a_rank_of_a_group_logs_its_place(ledger):
    first = ledger.start_run(level=3, workload="w", submission="s", backend="torch", seed=0)
    first.finish()
    with ledger.start_run(level=3, workload="w", submission="s", backend="torch", seed=0,
                          group="job-1", rank=2, world_size=4, parent=first) as run:
        run.mllog.event(mllog.EVAL_ACCURACY, 0.5)
    by_key = {r["key"]: r for r in mllog.parse(run.mllog.path)}
    assert by_key["d500_run_group"]["value"] == "job-1"
    assert (by_key["d500_rank"]["value"], by_key["d500_world_size"]["value"]) == (2, 4)
    assert by_key["d500_parent_run"]["value"] == first.id
    # events the ledger writes for the caller name the caller, not d500's ledger package
    assert by_key["d500_rank"]["metadata"]["file"] == Path(__file__).name
    assert by_key["run_stop"]["metadata"]["file"] == Path(__file__).name
    plain = {r["key"] for r in mllog.parse(first.mllog.path)}
    assert not plain & {"d500_run_group", "d500_rank", "d500_world_size", "d500_parent_run"}


def test_begin_false_keeps_the_log_in_init_until_run_begin(ledger):
    import time

    run = ledger.start_run(level=2, workload="w", submission="s", backend="torch", seed=1,
                           begin=False)
    keys = [r["key"] for r in mllog.parse(run.mllog.path)]
    assert keys[0] == "init_start" and "init_stop" not in keys and "run_start" not in keys
    time.sleep(0.3)  # model building, not timed (0.3 s: a loaded machine's preemption is less)
    run.begin()
    assert run.elapsed() < 0.3
    run.begin()  # once only
    run.finish("missed", figures={"time_to_accuracy": float("inf")})
    records = mllog.parse(run.mllog.path)
    keys = [r["key"] for r in records]
    assert keys.count("run_start") == 1
    assert keys.index("seed") < keys.index("init_stop") < keys.index("run_start")
    assert records[-1]["metadata"]["status"] == "aborted"
    assert records[-1]["metadata"]["d500_status"] == "missed"
    assert ledger.runs(status="missed")[0]["id"] == run.id and ledger.verify() == []
