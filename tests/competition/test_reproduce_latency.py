"""A bench run's latency forged (level 0: an operator; level 1: a backend on a network):
divided by 100 in its figures and its MLLOG alike and the ledger re-sealed with d500's own seal,
it passes `d500 check` (the log agrees with the record); `d500 reproduce` benches it again and,
on the run's own hardware, names the latency (d500.competition.reproduce_time.latency_checks).
The honest packages' reproductions agree (their times too, or inconclusive where the machine was
too loaded to judge them: see _honest), the
level-1 one re-run in the backend mode it recorded (issue 18: an entry named
`onnxruntime:basic` runs with onnxruntime's basic graph optimization).
The level-0 operator sleeps 2 ms a call, so its latency depends little on the load."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from d500 import mllog
from d500.competition.check import check
from d500.competition.export import build
from d500.competition.package import Package
from d500.competition.reproduce import RunReport, reproduce
from d500.competition.reproduce_time import LATENCIES, RATES
from d500.ledger import Ledger, integrity
from d500.paths import rulebook

from .test_consistency import forge, set_json

SLOW = (Path(__file__).parents[1] / "operators" / "ops" / "slow_ops.py").read_text()


def _reproduced(package: Path, ledger: Path, rules: Path | None = None) -> RunReport:
    """`d500 reproduce PACKAGE --runs 1`'s own function, in this process (its job still runs in
    a process of its own), under `rules` (default: the rules folder beside the package)."""
    [found] = reproduce(Package.open(package), runs=1, seed=0, ledger=ledger,
                        rules_dir=rules or package.parent / "rules").runs
    return found


def _honest(found: RunReport) -> None:
    """An honest run's reproduction agrees on everything; its times may be inconclusive (the
    load beside it too high to judge them: the rehearsal's parallel pass), never disagree."""
    wrong = [c for c in found.checks if not c.agrees]
    assert not found.problem and found.checks, found
    assert all(c.name in LATENCIES + RATES and c.inconclusive for c in wrong), wrong


def _forged(found: RunReport, forged: float) -> None:
    """A latency forged 100x never agrees: it disagrees wherever the load beside the
    reproduction explains less than 100x (judged or not), else it is inconclusive."""
    [latency] = [c for c in found.checks if c.name == "latency"]
    assert not latency.agrees and latency.recorded == forged
    assert found.verdict == ("inconclusive" if latency.inconclusive else "disagrees"), found
    if latency.inconclusive:
        assert latency.tolerance.startswith("not judged: this machine was too loaded"), latency


def _watched(again: dict) -> None:
    """A bench's reproduction records the load beside its timing, each pass apart, with the
    share of its runnable time its threads waited for a core (reproduce_time.slowdown)."""
    details = again["details"]
    assert {"during", "waited"} <= set(details["load_average"]), details["load_average"]
    assert set(details["load_by_pass"]) == {"latency", "throughput"}, details
    assert all("waited" in r for r in details["load_by_pass"].values()), details


@contextmanager
def _hogs(n: int) -> Iterator[None]:
    """`n` processes keeping a core busy each, outside the reproduction's tree (others')."""
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(0.2)
        yield
    finally:
        for p in spin:
            p.kill()
            p.wait(timeout=60)


def _packed(entry: Path, home: Path, out: Path) -> Path:
    return build(entry, out, home / "ledger.sqlite")


@pytest.mark.slow
def test_a_forged_level0_latency_passes_check_and_disagrees_on_reproduction(tmp_path, run_d500):
    entry, home = tmp_path / "slow-relu", tmp_path / "entrant"
    entry.mkdir()
    (entry / "relu.py").write_text(SLOW)
    (entry / "submission.yaml").write_text(
        "name: slow-relu\nlevel: 0\ndescription: a Relu that sleeps\nauthors: [t]\n"
        "operator: relu.py:SlowRelu\n")
    case = tmp_path / "rules" / "0-operators" / "relu-small.yaml"  # timed 0.3 s, not 2
    case.parent.mkdir(parents=True)
    case.write_text((rulebook() / "0-operators" / "relu-4d.yaml").read_text().replace(
        "name: relu-4d", "name: relu-small").replace("[[8, 32, 32, 32]]", "[[2, 8, 16, 16]]")
        + "time_budget: 0.3\n")
    done = run_d500(home, "op", "bench", str(entry), "--case", str(case), "--backends",
                    "reference", "--budget", "0.3")
    assert done.returncode == 0, done.stdout + done.stderr
    honest = _packed(entry, home, tmp_path / "honest.tar.gz")
    [run] = [r for r in Package.open(honest).runs() if r.submission == "slow-relu"]
    true = run.figures["latency"]
    assert true >= 0.002

    found = _reproduced(honest, tmp_path / "organiser" / "ledger.sqlite")
    _honest(found)
    assert any(c.name == "latency" for c in found.checks), found  # timed, compared

    forged = true / 100
    _forge_latency(home, run.origin_id, forged)
    package = _packed(entry, home, tmp_path / "forged.tar.gz")
    report = check(Package.open(package), case.parent.parent)
    assert not [p for p in report.problems if f"run {run.origin_id}" in p], report.problems
    records, _ = mllog.parse_text(next(r for r in Package.open(package).runs()
                                       if r.origin_id == run.origin_id).mllog_text)
    assert [r["value"] for r in records if r["key"] == "latency"] == [forged]

    found = _reproduced(package, tmp_path / "organiser2" / "ledger.sqlite")
    _forged(found, forged)


def _forge_latency(home: Path, run_id: int, forged: float) -> None:
    """The run's latency set to `forged` in its figures and its MLLOG, every seal re-made."""
    log = home / "runs" / str(run_id) / "mllog.txt"
    text = re.sub(r'("key": "latency", "value": )[0-9.e+-]+', rf"\g<1>{forged!r}",
                  log.read_text())
    assert f'"value": {forged!r}' in text
    log.write_text(text)

    def edit(db: sqlite3.Connection) -> int:
        set_json(db, run_id, "figures", latency=forged)
        stored = db.execute("SELECT mllog FROM runs WHERE id = ?", (run_id,)).fetchone()[0]
        db.execute("UPDATE artifacts SET sha256 = ?, bytes = ? WHERE run_id = ? AND path = ?",
                   (integrity.sha256_file(log), log.stat().st_size, run_id, stored))
        return run_id

    forge(home / "ledger.sqlite", edit)


@pytest.mark.slow
def test_a_forged_level1_bench_latency_disagrees_on_reproduction(tmp_path, run_d500):
    home, entry = tmp_path / "entrant", tmp_path / "ort-basic"
    entry.mkdir()
    (entry / "submission.yaml").write_text(
        "name: onnxruntime:basic\nlevel: 1\ndescription: onnxruntime, basic optimization\n")
    done = run_d500(home, "net", "bench", "mlp-mnist", "--backends", "onnxruntime:basic",
                    "--budget", "0.05", "--threads", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    honest = _packed(entry, home, tmp_path / "honest.tar.gz")
    [run] = Package.open(honest).runs()
    found = _reproduced(honest, tmp_path / "organiser" / "ledger.sqlite", rulebook())
    _honest(found)
    assert {"latency", "throughput"} <= {c.name for c in found.checks}, found
    [origin] = Ledger(home / "ledger.sqlite").runs(level=1)  # re-run in its recorded mode
    [again] = Ledger(tmp_path / "organiser" / "ledger.sqlite").runs(level=1)
    for done in (origin, again):
        assert (done["backend"], done["submission"], done["status"]) == (
            "onnxruntime:basic", "onnxruntime:basic", "succeeded")
        assert done["details"]["settings"]["graph_optimization_level"] == "ORT_ENABLE_BASIC"
    assert again["details"]["reproduction"]["origin_run"] == origin["id"]
    _watched(again)

    # a neighbour's burst beside the reproduction (the rehearsal's flake: 2.16x, read as
    # quiet and accused): honest, never disagrees
    with _hogs(1):
        found = _reproduced(honest, tmp_path / "organiser3" / "ledger.sqlite", rulebook())
    _honest(found)

    forged = run.figures["latency"] / 100
    _forge_latency(home, run.origin_id, forged)
    package = _packed(entry, home, tmp_path / "forged.tar.gz")
    report = check(Package.open(package), rulebook())
    assert not [p for p in report.problems if f"run {run.origin_id}" in p], report.problems
    found = _reproduced(package, tmp_path / "organiser2" / "ledger.sqlite", rulebook())
    _forged(found, forged)
