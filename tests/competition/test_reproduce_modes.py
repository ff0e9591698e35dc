"""d500 reproduce re-runs a level-1 run in the backend mode it recorded (issue 18): an entry
named `onnxruntime:basic` holds a `d500 net bench` of the rulebook's mlp-mnist on that mode; its
reproduction is recorded under the same full name and ran with onnxruntime's basic graph
optimization, as the origin did."""

from __future__ import annotations

import json

import pytest

from d500.ledger import Ledger


@pytest.mark.slow
def test_a_bench_run_reproduces_in_its_recorded_mode(tmp_path, run_d500):
    home, entry, package = tmp_path / "entrant", tmp_path / "ort-basic", tmp_path / "pkg.tar.gz"
    entry.mkdir()
    (entry / "submission.yaml").write_text(
        "name: onnxruntime:basic\nlevel: 1\ndescription: onnxruntime, basic optimization\n")
    done = run_d500(home, "net", "bench", "mlp-mnist", "--backends", "onnxruntime:basic",
                    "--budget", "0.05", "--threads", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    made = run_d500(home, "package", str(entry), "--out", str(package))
    assert made.returncode == 0, made.stderr
    organiser = tmp_path / "organiser"
    result = run_d500(organiser, "reproduce", str(package), "--runs", "1", "--seed", "0",
                      "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    found = json.loads(result.stdout)
    assert found["agrees"] and [r["verdict"] for r in found["runs"]] == ["agrees"]
    [origin] = Ledger(home / "ledger.sqlite").runs(level=1)
    [again] = Ledger(organiser / "ledger.sqlite").runs(level=1)
    for run in (origin, again):
        assert (run["backend"], run["submission"], run["status"]) == (
            "onnxruntime:basic", "onnxruntime:basic", "succeeded")
        assert run["details"]["settings"]["graph_optimization_level"] == "ORT_ENABLE_BASIC"
    assert again["details"]["reproduction"]["origin_run"] == origin["id"]
