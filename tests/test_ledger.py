"""The SQLite ledger: run lifecycle, SIGKILLed writers, concurrent writers, integrity, CLI,
schema migrations of old ledgers, groups and ranks, cached verification."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from d500 import provenance
from d500.errors import ConfigError, D500Error, Diverged, UsageError
from d500.ledger import SCHEMA_VERSION, Ledger, integrity, process_alive, process_identity
from d500.ledger.migrations import MIGRATIONS

PYTHON = sys.executable
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def workload(tmp_path: Path, metrics=("latency", "gflops"), name="conv") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\nlevel: 0\nmetrics: [{', '.join(metrics)}]\n")
    return path


def cli(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "D500_HOME": str(home)}
    return subprocess.run([PYTHON, "-m", "d500.cli", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120, check=False)


def test_run_lifecycle_records_everything(home, tmp_path):
    wf = workload(tmp_path)
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "op.py").write_text("def conv(): pass\n")
    (sub / "submission.yaml").write_text("name: mine\n")
    out = tmp_path / "out.bin"
    out.write_bytes(b"\x00" * 100)
    ledger = Ledger()
    with ledger.start_run(level=0, workload="conv", submission="mine", backend="numpy", seed=3,
                          hyperparameters={"tile": 8}, workload_file=wf,
                          submission_files=[sub]) as run:
        run.evaluation(step=1, epoch=0.5, metrics={"latency": 2e-3})
        run.artifact(out)
        run.record(figures={"latency": 1.5e-3}, details={"reps": 10})
        run.record(figures={"gflops": 4.2})
    rows = ledger.runs()
    assert len(rows) == 1
    r = rows[0]
    assert (r["level"], r["workload"], r["submission"], r["backend"], r["seed"]) == (
        0, "conv", "mine", "numpy", 3)
    assert r["status"] == "succeeded" and r["sealed"]
    assert r["figures"] == {"latency": 1.5e-3, "gflops": 4.2}
    assert r["details"] == {"reps": 10} and r["hyperparameters"] == {"tile": 8}
    assert r["workload_text"] == wf.read_text()
    assert len(r["submission_files"]) == 2 and r["duration"] >= 0
    full = ledger.get(r["id"])
    assert full["evaluations"][0]["metrics"] == {"latency": 2e-3}
    assert full["evaluations"][0]["epoch"] == 0.5
    paths = [Path(a["file"]) for a in full["artifacts"]]
    assert out in paths and (home / "runs" / str(r["id"]) / "mllog.txt") in paths
    assert full["provenance"]["cpu"]["logical_cores"] == os.cpu_count()
    assert ledger.verify() == []


@pytest.mark.parametrize("exc, status", [(Diverged("loss is nan"), "diverged"),
                                         (RuntimeError("boom"), "failed"),
                                         (TimeoutError("budget"), "timeout"),
                                         (KeyboardInterrupt(), "interrupted")])
def test_exception_sets_status_and_propagates(home, exc, status):
    ledger = Ledger()
    with (pytest.raises(type(exc)),
          ledger.start_run(level=2, workload="w", submission="s", backend="torch") as run):
        run.record(figures={"val_accuracy": 0.3})
        raise exc
    r = ledger.runs()[0]
    assert r["status"] == status and r["figures"] == {"val_accuracy": 0.3}
    assert r["error"]
    assert ledger.verify() == []
    assert ledger.runs(status="succeeded") == []


def test_unknown_metric_is_an_error_naming_it(home, tmp_path):
    ledger = Ledger()
    with (pytest.raises(D500Error, match="unknown metric 'speediness'"),
          ledger.start_run(level=0, workload="w", submission="s", backend="numpy") as run):
        run.record(figures={"speediness": 1.0})
    assert ledger.runs()[0]["status"] == "failed"
    bad = workload(tmp_path, metrics=("latency", "wibble"), name="bad")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*unknown metric 'wibble'"):
        ledger.start_run(level=0, workload="bad", submission="s", backend="numpy",
                         workload_file=bad)
    good = workload(tmp_path)
    with (pytest.raises(ConfigError, match=r"conv\.yaml.*unknown metric 'wobble'"),
          ledger.start_run(level=0, workload="conv", submission="s", backend="numpy",
                           workload_file=good) as run):
        run.record(figures={"wobble": 2.0})
    with (pytest.raises(D500Error, match="must be a number"),
          ledger.start_run(level=0, workload="w", submission="s", backend="numpy") as run):
        run.record(figures={"latency": "fast"})


def test_missing_files_are_config_errors(home, tmp_path):
    ledger = Ledger()
    with pytest.raises(ConfigError, match="nope.py"):
        ledger.start_run(level=0, workload="w", submission="s", backend="numpy",
                         submission_files=[tmp_path / "nope.py"])
    with pytest.raises(ConfigError, match="missing.onnx"):
        ledger.start_run(level=1, workload="w", submission="s", backend="numpy",
                         model_file=tmp_path / "missing.onnx")


WRITER = textwrap.dedent("""
    import sys, time
    from d500.ledger import Ledger
    ledger = Ledger()
    for seed in range(2):
        with ledger.start_run(level=0, workload="w", submission="s", backend="numpy",
                              seed=seed) as run:
            run.record(figures={"latency": 0.001 * (seed + 1)})
    run = ledger.start_run(level=2, workload="w", submission="s", backend="numpy", seed=9)
    run.evaluation(step=1, metrics={"val_accuracy": 0.4})
    run.record(figures={"val_accuracy": 0.4})
    print(run.id, flush=True)
    time.sleep(600)
""")


def test_sigkilled_writer_shows_as_interrupted(home):
    provenance.peak_flops()  # measured once here, cached for the child under D500_HOME
    proc = subprocess.Popen([PYTHON, "-c", WRITER], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "D500_HOME": str(home)}, cwd=ROOT)
    try:
        killed_id = int(proc.stdout.readline())
        ledger = Ledger()
        assert ledger.get(killed_id)["status"] == "running"  # alive: still running
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.stdout.close()
    runs = Ledger().runs()
    assert [r["status"] for r in runs] == ["succeeded", "succeeded", "interrupted"]
    assert runs[0]["figures"] == {"latency": 0.001} and runs[1]["figures"] == {"latency": 0.002}
    assert runs[2]["figures"] == {"val_accuracy": 0.4}  # recorded before the kill: kept
    assert Ledger().verify() == []
    listed = cli("ledger", "list", "--json", "--status", "interrupted", home=home)
    assert listed.returncode == 0, listed.stderr
    assert [r["id"] for r in json.loads(listed.stdout)] == [killed_id]
    # the next writer seals the dead run as interrupted; the chain stays intact
    ledger = Ledger()
    ledger.start_run(level=0, workload="w", submission="s", backend="numpy").finish()
    killed = ledger.get(killed_id)
    assert killed["recorded_status"] == "interrupted" and killed["sealed"]
    assert [a["path"] for a in killed["artifacts"]] == [killed["mllog"]]  # its log, hashed
    assert ledger.get(killed_id)["evaluations"][0]["metrics"] == {"val_accuracy": 0.4}
    assert ledger.verify() == []
    assert len(ledger.runs(status="succeeded")) == 3


def test_process_identity_detects_pid_reuse():
    me = process_identity()
    assert process_alive(me["pid"], me["host"], me["boot_id"], me["proc_start"]) is True
    if me["proc_start"] is not None:  # Linux: a different start time is another process
        assert process_alive(me["pid"], me["host"], me["boot_id"], "1") is False
        assert process_alive(me["pid"], me["host"], "another-boot", me["proc_start"]) is False
    assert process_alive(me["pid"], "some-other-host", None, None) is None


CONCURRENT = textwrap.dedent("""
    import sys
    from d500.ledger import Ledger
    ledger = Ledger()
    worker = int(sys.argv[1])
    for i in range(8):
        with ledger.start_run(level=0, workload="w", submission=f"worker{worker}",
                              backend="numpy", seed=i) as run:
            run.evaluation(step=i, metrics={"latency": i * 1e-3})
            run.record(figures={"latency": (worker * 100 + i) * 1e-6})
""")


@pytest.mark.slow
def test_concurrent_writers_do_not_corrupt(home):
    provenance.peak_flops()
    env = {**os.environ, "D500_HOME": str(home)}
    procs = [subprocess.Popen([PYTHON, "-c", CONCURRENT, str(w)], env=env, cwd=ROOT,
                              stderr=subprocess.PIPE, text=True) for w in range(4)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    ledger = Ledger()
    runs = ledger.runs()
    assert len(runs) == 32 and all(r["status"] == "succeeded" for r in runs)
    got = sorted(round(r["figures"]["latency"] * 1e6) for r in runs)
    assert got == sorted(w * 100 + i for w in range(4) for i in range(8))
    assert ledger.verify() == []
    db = sqlite3.connect(home / "ledger.sqlite")
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    seqs = [r[0] for r in db.execute("SELECT chain_seq FROM runs ORDER BY chain_seq")]
    assert seqs == list(range(1, 33))
    assert db.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0] == 32


def test_verify_catches_edited_figure_and_edited_submission_file(home, tmp_path):
    wf = workload(tmp_path)
    code = tmp_path / "op.py"
    code.write_text("SCALE = 1\n")
    ledger = Ledger()
    for seed in range(3):
        with ledger.start_run(level=0, workload="conv", submission="mine", backend="numpy",
                              seed=seed, workload_file=wf, submission_files=[code]) as run:
            run.record(figures={"latency": 1e-3 + seed * 1e-4, "gflops": 2.0})
    ok = cli("ledger", "verify", home=home)
    assert ok.returncode == 0 and "intact" in ok.stdout, ok.stdout + ok.stderr
    # somebody improves run 2's figure directly in the database ...
    db = sqlite3.connect(home / "ledger.sqlite")
    db.execute("UPDATE runs SET figures = ? WHERE id = 2", (json.dumps({"latency": 1e-6,
                                                                        "gflops": 2.0}),))
    db.commit()
    db.close()
    bad = cli("ledger", "verify", home=home)
    assert bad.returncode == 1
    assert "run 2: figures changed" in bad.stdout
    assert "run 1:" not in bad.stdout and "run 3:" not in bad.stdout
    # ... and the submission's code is edited after its runs: one finding about the file
    code.write_text("SCALE = 2\n")
    bad = cli("ledger", "verify", home=home)
    assert bad.returncode == 1  # for the figure
    assert f"submission file {code} differs from what runs 1..3 recorded" in bad.stdout
    assert "run 2: figures changed" in bad.stdout
    per_run, general = Ledger().verify_runs()
    assert general == [] and len(per_run[2]) == 2 and len(per_run[1]) == 1


def test_verify_catches_deleted_row_forged_status_and_edited_log(home):
    ledger = Ledger()
    for seed in range(3):
        with ledger.start_run(level=0, workload="w", submission="s", backend="numpy",
                              seed=seed) as run:
            run.record(figures={"latency": 1e-3})
    assert ledger.verify() == []
    mllog = Path(ledger.get(3)["mllog"].replace("$D500_HOME", str(home)))
    with mllog.open("a") as f:
        f.write(":::MLLOG {}\n")
    db = sqlite3.connect(home / "ledger.sqlite")
    db.execute("DELETE FROM artifacts WHERE run_id = 2")
    db.execute("DELETE FROM runs WHERE id = 2")
    db.execute("INSERT INTO runs (level, workload, submission, backend, status, started) "
               "VALUES (0, 'w', 'forged', 'numpy', 'succeeded', 0)")
    db.commit()
    db.close()
    problems = "\n".join(Ledger().verify())
    assert "sealed rows 2..2 are missing before run 3" in problems
    assert "run 3: chain link" in problems
    assert f"run 3: artifact {mllog} changed" in problems
    assert "run 4: status 'succeeded' but the row was never sealed" in problems
    db = sqlite3.connect(home / "ledger.sqlite")
    db.execute("DELETE FROM artifacts WHERE run_id = 3")
    db.execute("DELETE FROM runs WHERE id = 3")  # the newest sealed row
    db.commit()
    db.close()
    assert "the last sealed rows 2..3 are missing" in "\n".join(Ledger().verify())


def test_cli_list_show_export(home, tmp_path):
    ledger = Ledger()
    wf = workload(tmp_path)
    with ledger.start_run(level=0, workload="conv", submission="a", backend="numpy", seed=1,
                          workload_file=wf) as run:
        run.record(figures={"latency": 0.5e-3, "gflops": 10.0})
    with (pytest.raises(Diverged),
          ledger.start_run(level=2, workload="mnist", submission="b", backend="torch",
                           seed=2) as run):
        run.evaluation(step=5, epoch=1, metrics={"val_accuracy": 0.1})
        raise Diverged("loss is nan at step 5")
    listed = cli("ledger", "list", "--json", home=home)
    assert listed.returncode == 0, listed.stderr
    runs = json.loads(listed.stdout)
    for key in ("id", "level", "workload", "submission", "backend", "status", "seed",
                "started", "figures"):
        assert key in runs[0]
    assert [(r["id"], r["status"]) for r in runs] == [(1, "succeeded"), (2, "diverged")]
    only = json.loads(cli("ledger", "list", "--json", "--level", "2", home=home).stdout)
    assert [r["id"] for r in only] == [2]
    table = cli("ledger", "list", "--workload", "conv", home=home)
    assert table.returncode == 0 and "conv" in table.stdout and "mnist" not in table.stdout
    assert "1 run in " in table.stdout and "2 runs in " in cli("ledger", "list", home=home).stdout
    typo = cli("ledger", "list", "--workload", "cnov", home=home)  # not "no runs recorded"
    assert typo.returncode == 0 and "no run of the 2 in " in typo.stdout
    assert "matches --workload cnov (did you mean 'conv'?)" in typo.stdout
    assert cli("ledger", "list", "--workload", "mnist", "--status", "failed",
               home=home).stdout.strip().endswith("matches --workload mnist --status failed")
    typo = cli("ledger", "export", "--workload", "cnov", home=home)
    assert typo.returncode == 0 and typo.stdout.count("\n") == 1  # the CSV header alone
    assert typo.stderr == "d500 ledger export: no run matches --workload cnov (did you mean " \
                          "'conv'?)\n"
    near = cli("ledger", "list", "--submission", "bb", "--json", home=home)
    assert near.returncode == 0 and json.loads(near.stdout) == []
    assert near.stderr == "d500 ledger list: no run matches --submission bb (did you mean " \
                          "'b'?)\n"
    show = cli("ledger", "show", "last", home=home)
    assert show.returncode == 0
    assert "diverged" in show.stdout and "loss is nan at step 5" in show.stdout
    assert "val_accuracy" in show.stdout and "verify: intact" in show.stdout
    assert "b on torch  diverged" in show.stdout  # no world size at level 2
    missing = cli("ledger", "show", "99", home=home)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "no run 99" in missing.stderr
    exported = cli("ledger", "export", "--format", "csv", home=home)
    rows = list(csv.DictReader(io.StringIO(exported.stdout)))
    assert [r["status"] for r in rows] == ["succeeded", "diverged"]
    assert float(rows[0]["gflops"]) == 10.0 and rows[1]["gflops"] == ""
    jsonl = cli("ledger", "export", "--format", "jsonl", home=home).stdout.splitlines()
    assert [json.loads(line)["submission"] for line in jsonl] == ["a", "b"]
    out = tmp_path / "all.json"
    wrote = cli("ledger", "export", "--out", str(out), home=home)
    assert wrote.returncode == 0 and wrote.stderr == f"wrote 2 runs to {out}\n"  # by its name
    one = cli("ledger", "export", "--level", "0", "--out", str(tmp_path / "a.csv"),
              home=home)
    assert one.stderr == f"wrote 1 run to {tmp_path / 'a.csv'}\n"  # not "1 runs"
    everything = json.loads(out.read_text())
    assert everything[0]["figures"]["gflops"] == 10.0
    assert everything[1]["evaluations"][0]["metrics"] == {"val_accuracy": 0.1}
    assert everything[0]["provenance"]["cpu"]["logical_cores"] == os.cpu_count()
    assert everything[0]["artifacts"][0]["path"].endswith("mllog.txt")
    assert rows[0]["machine"] and "numpy" in rows[0]["machine"]
    bad = cli("ledger", "export", "--format", "xml", home=home)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    unwritable = cli("ledger", "export", "--out", str(blocked / "x.csv"), home=home)
    assert unwritable.returncode == 2 and unwritable.stderr.count("\n") == 1
    assert "cannot write it" in unwritable.stderr and "Traceback" not in unwritable.stderr
    assert cli("ledger", "list", "--level", "7", home=home).returncode == 2
    with ledger.start_run(level=3, workload="digits-mlp", submission="s", backend="torch",
                          seed=3, world_size=2, group="g", rank=0) as run:
        run.finish("failed", error="a level-3 run cut short")
    assert "run 3  level 3  digits-mlp  s on torch x2 ranks  failed" in cli(
        "ledger", "show", "3", home=home).stdout  # at how many ranks it ran


def test_studies_record_every_trial(home):
    ledger = Ledger()
    with ledger.start_study("lr-sweep", level=2, workload="mnist", submission="sgd",
                            backend="torch", objective="val_accuracy",
                            search_space={"lr": [0.01, 1.0]}) as study:
        for i, lr in enumerate((0.01, 0.1, 10.0)):
            try:
                with study.trial({"lr": lr}, seed=i) as run:
                    if lr > 1:
                        raise Diverged("loss is inf")
                    run.record(figures={"val_accuracy": 0.5 + lr})
            except Diverged:
                pass
    [s] = ledger.studies()
    assert s["status"] == "succeeded" and s["search_space"] == {"lr": [0.01, 1.0]}
    trials = ledger.trials(s["id"])
    assert [t["number"] for t in trials] == [0, 1, 2]
    assert [t["run"]["status"] for t in trials] == ["succeeded", "succeeded", "diverged"]
    assert [t["params"]["lr"] for t in trials] == [0.01, 0.1, 10.0]
    assert all(r["study"] == s["id"] for r in ledger.runs())
    assert ledger.verify() == []
    with pytest.raises(UsageError):
        ledger.get("abc")


def test_workload_text_and_hash_survive_crlf(home, tmp_path):
    wf = tmp_path / "crlf.yaml"
    wf.write_bytes(b"name: crlf\r\nlevel: 0\r\nmetrics: [latency]\r\n")
    ledger = Ledger()
    ledger.start_run(level=0, workload="crlf", submission="s", backend="numpy",
                     workload_file=wf).finish(figures={"latency": 1.0})
    assert ledger.runs()[0]["workload_text"] == wf.read_bytes().decode()
    assert ledger.verify() == []


# ------------------------------------------------------------ schema migrations

DATA = Path(__file__).resolve().parent / "data"


def v1_copy(tmp_path: Path) -> Path:
    """A copy of the schema-1 ledger that tests/data/make_ledger_v1.py wrote with the old code."""
    folder = shutil.copytree(DATA / "ledger-v1", tmp_path / "v1")
    return folder / "ledger.sqlite"


def columns(path: Path) -> set[str]:
    db = sqlite3.connect(path)
    try:
        return {r[1] for r in db.execute("PRAGMA table_info(runs)")}
    finally:
        db.close()


def schema_version(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        return int(db.execute("SELECT value FROM meta WHERE key = 'schema_version'"
                              ).fetchone()[0])
    finally:
        db.close()


def test_v1_ledger_is_upgraded_in_place_and_still_verifies(home, tmp_path):
    path = v1_copy(tmp_path)
    assert schema_version(path) == 1 and "run_group" not in columns(path)
    ledger = Ledger(path)
    assert ledger.schema_version == SCHEMA_VERSION == schema_version(path) >= 3
    assert {"run_group", "rank", "world_size", "parent_run"} <= columns(path)
    runs = ledger.runs()
    assert [(r["id"], r["status"]) for r in runs] == [
        (1, "succeeded"), (2, "failed"), (3, "succeeded"), (4, "succeeded"), (5, "diverged")]
    assert all((r["group"], r["rank"], r["world_size"], r["parent"]) == (None,) * 4
               for r in runs)
    assert runs[0]["figures"] == {"latency": 1.5e-6, "gflops": 0.004}
    assert [t["run"]["status"] for t in ledger.trials(ledger.studies()[0]["id"])] == [
        "succeeded", "succeeded", "diverged"]
    first = ledger.get(1)
    assert len(first["evaluations"]) == 1 and len(first["artifacts"]) == 2
    assert ledger.verify() == []
    ledger.close()
    ok = cli("ledger", "--ledger", str(path), "verify", home=home)
    assert ok.returncode == 0 and "intact (5 sealed runs" in ok.stdout, ok.stdout + ok.stderr
    # the chain goes on from the old rows; a new run's group and rank are sealed with it
    ledger = Ledger(path)
    ledger.start_run(level=3, workload="w", submission="s", backend="numpy", group="job-7",
                     rank=1, world_size=2, parent=3).finish(figures={"latency": 1.0})
    assert ledger.get(6)["group"] == "job-7"
    assert ledger.verify() == []
    # a value written into an old row's new column is a change the chain reports
    db = sqlite3.connect(path)
    db.execute("UPDATE runs SET run_group = 'forged', rank = 0 WHERE id = 4")
    db.execute("UPDATE runs SET world_size = NULL WHERE id = 6")
    db.commit()
    db.close()
    problems = ledger.verify()
    assert "run 4: run_group, rank changed in the database" in problems[0]
    assert "run 6: world_size changed in the database" in problems[1]
    assert len(problems) == 2


def test_ledger_of_a_newer_schema_is_refused_untouched(home, tmp_path):
    path = tmp_path / "new.sqlite"
    Ledger(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
               (str(SCHEMA_VERSION + 1),))
    db.commit()
    db.close()
    before = columns(path)
    with pytest.raises(D500Error, match=rf"new\.sqlite: ledger schema version "
                                        rf"{SCHEMA_VERSION + 1} is newer than this d500 "
                                        rf"understands \({SCHEMA_VERSION}\)"):
        Ledger(path)
    assert schema_version(path) == SCHEMA_VERSION + 1 and columns(path) == before
    shown = cli("ledger", "--ledger", str(path), "list", home=home)
    assert shown.returncode == 2 and shown.stderr.count("\n") == 1, shown.stderr
    assert "is newer than this d500" in shown.stderr and "Traceback" not in shown.stderr


def test_other_databases_are_not_taken_for_ledgers(home, tmp_path):
    other = tmp_path / "other.sqlite"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE runs (x)")
    db.commit()
    db.close()
    with pytest.raises(D500Error, match="other.sqlite: an SQLite database but not a d500 ledger"):
        Ledger(other)
    db = sqlite3.connect(other)  # left as it was: d500 had set WAL mode, kept in the file
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    db.close()
    text = tmp_path / "notes.sqlite"
    text.write_text("not a database at all\n" * 100)
    with pytest.raises(D500Error, match="notes.sqlite: not a usable ledger database"):
        Ledger(text)


def test_migrations_are_numbered_from_1_and_a_new_ledger_is_current(home):
    assert [m[0] for m in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))
    ledger = Ledger()
    assert ledger.schema_version == SCHEMA_VERSION == schema_version(home / "ledger.sqlite")


OPENER = textwrap.dedent("""
    import sys
    from d500.ledger import Ledger
    ledger = Ledger(sys.argv[1])
    print(ledger.schema_version, len(ledger.runs()), len(ledger.verify()))
""")


@pytest.mark.slow
def test_processes_opening_an_old_ledger_at_once_upgrade_it_once(home, tmp_path):
    path = v1_copy(tmp_path)
    env = {**os.environ, "D500_HOME": str(home)}
    procs = [subprocess.Popen([PYTHON, "-c", OPENER, str(path)], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert out.split() == [str(SCHEMA_VERSION), "5", "0"]
    assert schema_version(path) == SCHEMA_VERSION and "parent_run" in columns(path)


# ------------------------------------------------------------ groups, ranks, parents

def test_group_rank_world_size_and_parent_are_recorded_and_sealed(home):
    ledger = Ledger()
    parent = ledger.start_run(level=2, workload="w", submission="s", backend="torch", seed=0)
    parent.finish(figures={"val_accuracy": 0.5})
    for rank in range(2):
        with ledger.start_run(level=3, workload="w", submission="s", backend="torch", seed=0,
                              group="allreduce-1", rank=rank, world_size=2,
                              parent=parent) as run:
            run.record(figures={"val_accuracy": 0.6})
    with ledger.start_run(level=2, workload="w", submission="s", backend="torch", seed=1,
                          group=17) as run:
        pass
    runs = ledger.runs()
    assert [(r["group"], r["rank"], r["world_size"], r["parent"]) for r in runs] == [
        (None, None, None, None), ("allreduce-1", 0, 2, 1), ("allreduce-1", 1, 2, 1),
        ("17", None, None, None)]
    assert [r["id"] for r in ledger.runs(group="allreduce-1")] == [2, 3]
    assert [r["id"] for r in ledger.runs(group=17)] == [4]
    full = ledger.get(3)
    assert (full["group"], full["rank"], full["world_size"], full["parent"]) == (
        "allreduce-1", 1, 2, 1)
    assert ledger.verify() == []
    db = sqlite3.connect(home / "ledger.sqlite")
    db.execute("UPDATE runs SET rank = 0 WHERE id = 3")
    db.execute("UPDATE runs SET parent_run = NULL WHERE id = 2")
    db.commit()
    db.close()
    problems = ledger.verify()
    assert problems == ["run 2: parent_run changed in the database since the run was recorded",
                        "run 3: rank changed in the database since the run was recorded"]


@pytest.mark.parametrize("kwargs, message", [
    ({"rank": 0}, "run rank 0 needs a world_size above it"),
    ({"rank": 2, "world_size": 2}, "run rank 2 needs a world_size above it"),
    ({"world_size": 0}, "world_size must be at least 1"),
    ({"rank": "0", "world_size": 2}, "run rank must be an integer"),
    ({"group": ""}, "run group must be a non-empty string"),
    ({"parent": 99}, "parent run 99: no such run in the ledger"),
])
def test_bad_placement_is_an_error_and_records_nothing(home, kwargs, message):
    ledger = Ledger()
    with pytest.raises(D500Error, match=message):
        ledger.start_run(level=3, workload="w", submission="s", backend="numpy", **kwargs)
    assert ledger.runs() == []


# ------------------------------------------------------------ cached verification

class HashCounter:
    """Counts the files integrity hashes (the real sha256_file does the work)."""

    def __init__(self, monkeypatch):
        self.paths: list[Path] = []
        real = integrity.sha256_file

        def counting(path):
            self.paths.append(Path(path))
            return real(path)
        monkeypatch.setattr(integrity, "sha256_file", counting)

    def take(self) -> list[Path]:
        taken, self.paths = self.paths, []
        return taken


def test_verify_runs_rehashes_only_changed_files(home, tmp_path, monkeypatch):
    wf = workload(tmp_path)
    code = tmp_path / "op.py"
    code.write_text("SCALE = 1\n")
    ledger = Ledger()
    for seed in range(2):
        with ledger.start_run(level=0, workload="conv", submission="mine", backend="numpy",
                              seed=seed, workload_file=wf, submission_files=[code]) as run:
            run.record(figures={"latency": 1e-3})
    files = {wf, code, home / "runs" / "1" / "mllog.txt", home / "runs" / "2" / "mllog.txt"}
    # files changed within the timestamp granularity of their hashing: their mtime is put ahead
    # of the clock, since the runs above can take longer than RACY_NS on a loaded machine (the
    # first start_run in a fresh home measures the peak FLOP/s), which would age them
    ahead = time.time_ns() + 86_400 * 10**9
    for f in files:
        os.utime(f, ns=(ahead, ahead))
    hashed = HashCounter(monkeypatch)
    assert ledger.verify_runs() == ({1: [], 2: []}, [])
    assert set(hashed.take()) == files  # nothing cached yet; each file hashed once
    # ... so they are hashed again
    assert ledger.verify_runs() == ({1: [], 2: []}, [])
    assert set(hashed.take()) == files
    for f in files:
        os.utime(f)  # last changed now
    time.sleep(integrity.RACY_NS / 1e9 + 0.1)
    ledger.verify_runs()  # hashed now, well after their last change: the digests are reusable
    hashed.take()
    assert ledger.verify_runs() == ({1: [], 2: []}, [])
    assert hashed.take() == []  # the leaderboard's render: nothing re-hashed
    assert Ledger().verify_runs() == ({1: [], 2: []}, []) and hashed.take() == []
    # new content of the same size, with the old mtime put back: the ctime still moved
    st = code.stat()
    code.write_text("SCALE = 2\n")
    os.utime(code, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert code.stat().st_size == st.st_size and code.stat().st_mtime_ns == st.st_mtime_ns
    per_run, _ = ledger.verify_runs()
    assert hashed.take() == [code]
    for rid in (1, 2):
        [problem] = per_run[rid]
        assert problem.startswith(f"run {rid}: submission file {code} changed since it was "
                                  "recorded")
    # rehash=True (d500 ledger verify) hashes every file whatever the cache says
    assert len(ledger.verify(rehash=True)) == 2
    assert sorted(hashed.take()) == sorted(files)


def test_cli_verify_does_not_trust_the_digest_cache(home, tmp_path):
    code = tmp_path / "op.py"
    code.write_text("SCALE = 1\n")
    ledger = Ledger()
    ledger.start_run(level=0, workload="w", submission="mine", backend="numpy",
                     submission_files=[code]).finish(figures={"latency": 1e-3})
    [recorded] = ledger.get(1)["submission_files"].values()
    code.write_text("SCALE = 9\n")
    st = code.stat()
    db = sqlite3.connect(home / "ledger.sqlite")  # a digest planted for the edited file
    db.execute("INSERT OR REPLACE INTO file_digests VALUES (?,?,?,?,?,?,?)",
               (str(code), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, recorded,
                time.time_ns() + 10**10))
    db.commit()
    db.close()
    assert ledger.verify_runs() == ({1: []}, [])  # the cache is believed on the render path
    found = cli("ledger", "verify", home=home)  # a changed file is a finding, not tampering
    assert found.returncode == 0 and found.stdout.startswith(
        f"submission file {code} differs from what run 1 recorded"), found.stdout
    [problem] = ledger.verify_runs()[0][1]  # the cache refreshed: the render path sees it too
    assert problem.startswith(f"run 1: submission file {code} changed since it was recorded")


# -- each check of `ledger verify` on its own: tamper with one thing, verify names exactly it --

def three_runs_with_a_model(tmp_path: Path) -> tuple[Ledger, Path]:
    model = tmp_path / "model.onnx"
    model.write_bytes(b"\x08\x07" + bytes(range(64)))
    ledger = Ledger()
    for seed in range(3):
        with ledger.start_run(level=1, workload="net", submission="torch", backend="torch",
                              seed=seed, model_file=model) as run:
            run.record(figures={"latency": 1e-3 * (seed + 1)})
    assert ledger.verify() == []
    return ledger, model


def tamper(home: Path, sql: str, *args) -> None:
    db = sqlite3.connect(home / "ledger.sqlite")
    db.execute(sql, args)
    db.commit()
    db.close()


def test_verify_names_a_changed_model_file_alone(home, tmp_path):
    ledger, model = three_runs_with_a_model(tmp_path)
    model.write_bytes(model.read_bytes()[:-1] + b"\xff")  # one byte of the weights
    problems = ledger.verify()
    assert [p.split(" (sha256")[0] for p in problems] == [
        f"run {rid}: model file {model} changed since it was recorded" for rid in (1, 2, 3)]
    model.unlink()
    assert ledger.verify() == [f"run {rid}: model file {model} is missing" for rid in (1, 2, 3)]


def test_verify_names_an_edited_seal_alone(home, tmp_path):
    ledger, _ = three_runs_with_a_model(tmp_path)
    db = sqlite3.connect(home / "ledger.sqlite")
    sealed = db.execute("SELECT sealed FROM runs WHERE id = 2").fetchone()[0]
    db.close()
    # the same field hashes, written differently: only the row hash over the seal can tell
    reformatted = json.dumps(json.loads(sealed), sort_keys=True, indent=1)
    assert reformatted != sealed and json.loads(reformatted) == json.loads(sealed)
    tamper(home, "UPDATE runs SET sealed = ? WHERE id = 2", reformatted)
    assert ledger.verify() == ["run 2: row hash does not match (its seal was edited)"]


def test_verify_names_edited_provenance_alone(home, tmp_path):
    ledger, _ = three_runs_with_a_model(tmp_path)
    db = sqlite3.connect(home / "ledger.sqlite")
    [(env_id, text)] = db.execute("SELECT id, provenance FROM environments").fetchall()
    db.close()
    forged = json.loads(text)
    forged["peak_flops"] = forged["peak_flops"] / 10  # every peak_fraction 10x better
    tamper(home, "UPDATE environments SET provenance = ? WHERE id = ?",
           json.dumps(forged, sort_keys=True), env_id)
    assert ledger.verify() == [f"environment {env_id}: provenance changed since it was recorded"]
    bad = cli("ledger", "verify", home=home)
    assert bad.returncode == 1 and f"environment {env_id}: provenance changed" in bad.stdout


def test_verify_names_a_seed_edited_in_the_database(home, tmp_path):
    """A seed is part of the seal: one edited straight in the SQLite file (a slow seed passed
    off as another) is named, and `ledger verify` exits 1."""
    ledger, _ = three_runs_with_a_model(tmp_path)
    tamper(home, "UPDATE runs SET seed = 7 WHERE id = 2")
    assert ledger.verify() == ["run 2: seed changed in the database since the run was recorded"]
    bad = cli("ledger", "verify", home=home)
    assert bad.returncode == 1 and "run 2: seed changed in the database" in bad.stdout
    tamper(home, "UPDATE runs SET seed = NULL WHERE id = 3")
    assert "run 3: seed changed in the database since the run was recorded" in ledger.verify()


def test_verify_names_an_edited_chain_head_alone(home, tmp_path):
    ledger, _ = three_runs_with_a_model(tmp_path)
    db = sqlite3.connect(home / "ledger.sqlite")
    value = db.execute("SELECT value FROM meta WHERE key = 'chain_head'").fetchone()[0]
    seq, digest = value.split()
    db.close()
    assert seq == "3"
    tamper(home, "UPDATE meta SET value = ? WHERE key = 'chain_head'", f"3 {'0' * 64}")
    head = "chain: the last sealed row does not match the recorded chain head"
    assert ledger.verify() == [head]
    tamper(home, "UPDATE meta SET value = ? WHERE key = 'chain_head'", f"3 {digest}")
    assert ledger.verify() == []


def test_a_swapped_environment_is_named_by_verify(home, tmp_path):
    """A run's environment pointed at a forged provenance (another CPU) whose digest is its own
    hash, nothing re-sealed: the seal covers the provenance's digest, not the local id."""
    ledger, _ = three_runs_with_a_model(tmp_path)
    db = sqlite3.connect(home / "ledger.sqlite")
    [(env_id, text)] = db.execute("SELECT id, provenance FROM environments").fetchall()
    sealed = json.loads(db.execute("SELECT sealed FROM runs WHERE id = 2").fetchone()[0])
    db.close()
    assert "environment" in sealed and "env_id" not in sealed
    forged = json.loads(text)
    forged["cpu"]["model"] = "Forged CPU 9000"
    forged_text = json.dumps(forged, sort_keys=True)
    tamper(home, "INSERT INTO environments (digest, provenance, recorded) VALUES (?, ?, 0)",
           integrity.sha(forged_text), forged_text)
    tamper(home, "UPDATE runs SET env_id = (SELECT MAX(id) FROM environments) WHERE id = 2")
    assert ledger.verify() == [
        "run 2: environment changed in the database since the run was recorded"]
    # the environment row itself rewritten with its digest: every run on it is named
    tamper(home, "UPDATE runs SET env_id = ? WHERE id = 2", env_id)
    tamper(home, "UPDATE environments SET provenance = ?, digest = ? WHERE id = ?",
           forged_text, "0" * 64, env_id)  # the digest column is UNIQUE: the row keeps its own
    tamper(home, "DELETE FROM environments WHERE id != ?", env_id)
    tamper(home, "UPDATE environments SET digest = ? WHERE id = ?", integrity.sha(forged_text),
           env_id)
    bad = cli("ledger", "verify", home=home)
    assert bad.returncode == 1 and bad.stdout.splitlines() == [
        f"run {rid}: environment changed in the database since the run was recorded"
        for rid in (1, 2, 3)], bad.stdout


def test_a_legacy_seal_over_env_id_still_verifies_and_is_checked(home, tmp_path):
    """A row sealed before the digest was (its seal covers env_id) verifies as it was, and a
    changed env_id is still named."""
    ledger, _ = three_runs_with_a_model(tmp_path)
    db = sqlite3.connect(home / "ledger.sqlite")
    db.row_factory = sqlite3.Row
    old = integrity.seal_fields(*integrity.sealed_record(db, 1), integrity.LEGACY)
    db.close()
    assert "env_id" in old and "environment" not in old
    sealed = json.dumps(old, sort_keys=True)
    digest = integrity.row_hash(integrity.GENESIS, 1, sealed)
    tamper(home, "UPDATE runs SET sealed = ?, row_hash = ? WHERE id = 1", sealed, digest)
    tamper(home, "UPDATE runs SET prev_hash = ? WHERE id = 2", digest)
    db = sqlite3.connect(home / "ledger.sqlite")
    second = db.execute("SELECT sealed FROM runs WHERE id = 2").fetchone()[0]
    db.close()
    tamper(home, "UPDATE runs SET row_hash = ? WHERE id = 2",
           integrity.row_hash(digest, 2, second))
    tamper(home, "UPDATE runs SET prev_hash = (SELECT row_hash FROM runs WHERE id = 2) "
           "WHERE id = 3")
    db = sqlite3.connect(home / "ledger.sqlite")
    third, prev = db.execute("SELECT sealed, prev_hash FROM runs WHERE id = 3").fetchone()
    db.close()
    head = integrity.row_hash(prev, 3, third)
    tamper(home, "UPDATE runs SET row_hash = ? WHERE id = 3", head)
    tamper(home, "UPDATE meta SET value = ? WHERE key = 'chain_head'", f"3 {head}")
    assert ledger.verify() == []
    tamper(home, "UPDATE runs SET env_id = NULL WHERE id = 1")
    assert ledger.verify() == ["run 1: env_id changed in the database since the run was recorded"]
