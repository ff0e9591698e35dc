"""Conformance results as ledger runs: a complete node-suite run on onnxruntime (the fastest
complete run: ~10 s of tests, measured on a loaded 2-core machine, its node tests copied from the
session's cache, tests/helpers.seed_node_tests; the reference takes ~18 s, torch ~28 s) counted as
the backend's conformance, `--op` runs recorded as partial and never counted, a killed run left
interrupted, and the count in the level-1 organiser's summary."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import onnx
import onnx.defs
import pytest

from d500 import conformance_runs, leaderboard
from d500.conformance import _op_of, node_tests
from d500.leaderboard import summary
from d500.ledger import Ledger
from tests.helpers import seed_node_tests, tiny_mlp

pytestmark = pytest.mark.slow  # one complete node suite (~30 s in all)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """In order: a partial reference run (Relu), a complete onnxruntime run, then a partial
    onnxruntime run (newer than the complete one), and one level-1 benchmark on both."""
    from d500.networks import workloads
    from d500.networks.bench import bench

    folder = tmp_path_factory.mktemp("conformance")
    mp = pytest.MonkeyPatch()
    mp.setenv("D500_HOME", str(folder / "home"))
    seed_node_tests(folder / "home")
    ledger = Ledger()
    tests = node_tests()  # read once, shared by the three runs
    relu = [t for t in tests if _op_of(t) == "Relu"]
    runs = {}
    runs["reference-relu"] = conformance_runs.record("reference", ["relu"], ledger=ledger,
                                                     tests=relu, progress=False)
    started = time.perf_counter()
    runs["onnxruntime"] = conformance_runs.record("onnxruntime", ledger=ledger, tests=tests,
                                                  progress=False)
    print(f"complete onnxruntime run: {time.perf_counter() - started:.1f} s")
    runs["onnxruntime-relu"] = conformance_runs.record("onnxruntime", ["Relu"], ledger=ledger,
                                                       tests=relu, progress=False)
    path = folder / "tiny-net.yaml"
    path.write_text(tiny_mlp("tiny-net"))
    assert bench(workloads.load(path), ["reference", "onnxruntime"], ledger=ledger,
                 budget=0.05).exit_code == 0
    yield ledger, runs, len(tests), len(relu)
    mp.undo()


def test_a_complete_run_is_one_sealed_run_with_its_counts(recorded):
    ledger, runs, n_tests, _ = recorded
    outcomes, run_id = runs["onnxruntime"]
    run = ledger.get(run_id)
    assert (run["level"], run["workload"], run["submission"], run["backend"]) == (
        1, "onnx-node-suite", "conformance", "onnxruntime")
    assert run["status"] == "succeeded" and run["sealed"]
    f, d = run["figures"], run["details"]
    status = [o.status for o in outcomes]
    assert f["node_tests_total"] == n_tests == len(outcomes) == 1872
    assert f["node_tests_passed"] == status.count("pass")
    assert f["node_tests_failed"] == status.count("fail") > 0  # onnxruntime fails some
    assert f["node_tests_unsupported"] == status.count("unsupported") > 0  # e.g. ImageDecoder
    assert d["partial"] is False and d["ops"] is None
    assert (d["onnx_version"], d["opset"]) == (onnx.__version__, onnx.defs.onnx_opset_version())
    assert d["failed_tests"] == sorted(o.test for o in outcomes if o.status == "fail")
    assert "test_image_decoder_decode_jpeg_rgb" in d["unsupported_tests"]
    assert ledger.verify() == []


def by_backend(ledger: Ledger) -> dict[str, conformance_runs.Count]:
    """The latest complete conformance run of each backend (the tests' ledgers hold one machine)."""
    return conformance_runs.latest_by(ledger, lambda run: run["backend"])


def test_partial_runs_are_recorded_apart_and_never_counted(recorded):
    ledger, runs, _, n_relu = recorded
    run = ledger.get(runs["reference-relu"][1])
    assert run["workload"] == "onnx-node-suite:Relu" and run["status"] == "succeeded"
    assert run["details"]["partial"] is True and run["details"]["ops"] == ["Relu"]
    assert run["figures"]["node_tests_total"] == n_relu == run["figures"]["node_tests_passed"]
    assert by_backend(ledger).get("reference") is None  # only a partial run
    count = by_backend(ledger)["onnxruntime"]  # a newer partial run exists
    complete = ledger.get(runs["onnxruntime"][1])
    assert count.run_id == complete["id"]
    assert (count.passed, count.total) == (complete["figures"]["node_tests_passed"], 1872)
    assert count.date == complete["started"][:10]
    assert set(by_backend(ledger)) == {"onnxruntime"}


def test_the_level1_summary_shows_each_backends_count_with_its_date(recorded):
    ledger = recorded[0]
    count = by_backend(ledger)["onnxruntime"]
    [part] = leaderboard.parts(leaderboard.build(ledger, level=1), ledger)
    view = part.views[0]
    assert view.title.startswith("Organiser's summary")
    cells = {row[0]: row[-1] for row in view.rows}
    assert cells == {"onnxruntime": f"{count.passed} / 1872 ({count.date})",
                     "reference": summary.NOT_RECORDED}
    conf = next(n for n in view.notes if n.startswith("ONNX conformance"))
    assert f"onnx {onnx.__version__}" in conf and f"ledger run {count.run_id})" in conf
    assert "partial (--op) runs never count" in conf
    # the conformance runs are level-1 runs without rules: shown as boards, never profiled
    boards = leaderboard.build(ledger, level=1)
    s = summary.summarise(boards, by_submission=False)
    assert s.workloads == ["tiny-net"]
    # a partial run is a quick check: no board of its own (the complete run has one)
    assert {b.workload for b in boards} == {"tiny-net", "onnx-node-suite"}


def test_a_killed_run_stays_interrupted_and_counts_for_nothing(tmp_path):
    home = tmp_path / "home"
    seed_node_tests(home)
    env = {**os.environ, "D500_HOME": str(home)}
    proc = subprocess.Popen([sys.executable, "-m", "d500.cli", "conformance", "--backend",
                             "reference", "--json"], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240

    def wait_until(ready) -> None:
        while not ready():
            assert proc.poll() is None, "the suite ended before its run was seen running"
            assert time.monotonic() < deadline, "no running conformance run appeared"
            time.sleep(0.2)

    try:
        wait_until((home / "ledger.sqlite").exists)
        ledger = Ledger(home / "ledger.sqlite")
        wait_until(lambda: ledger.runs(status="running"))
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    [run] = ledger.runs()
    assert (run["workload"], run["backend"], run["status"]) == (
        "onnx-node-suite", "reference", "interrupted")
    assert by_backend(ledger).get("reference") is None
