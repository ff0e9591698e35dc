"""The judge pauses its clock for test accuracy where the kept models outgrow
d500.training.heldout.LIMIT (an entry's bigger model): it records those steps in the run's
details ("held_tests", as checkpoints are), and d500 check reads the delay after them as that
pause, so an honest run of a big model passes check. A claim of a hold under LIMIT is no pause
(the forged delays of test_red_team.py's
test_delays_after_evaluations_without_a_checkpoint_are_no_pause carry none and stay caught)."""

from __future__ import annotations

import os
import subprocess
import sys

from d500 import mllog
from d500.competition.check import check
from d500.competition.consistency import rules
from d500.competition.consistency_training import Training
from d500.competition.export import build
from d500.competition.package import Package
from d500.training import heldout
from tests.helpers import seed_peak


def test_a_run_holding_its_tests_past_the_limit_passes_check(rules_dir, entry_dir, tmp_path,
                                                              monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    seed_peak(home)
    monkeypatch.setenv("D500_HOME", str(home))
    monkeypatch.delenv("D500_DATA", raising=False)
    workload = rules_dir / "2-training" / "digits-mlp.yaml"
    # a process of its own (--threads 1 refuses a process where TensorFlow already ran, as a
    # test worker's may have), LIMIT 0 there: every evaluation's kept model past it, held
    code = ("import sys; from d500.training import heldout; heldout.LIMIT = 0; "
            "from d500.cli import main; sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", code, "train", str(workload), "--submission",
                           str(entry_dir), "--seeds", "1", "--threads", "1"],
                          env=dict(os.environ), capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    monkeypatch.setattr(heldout, "LIMIT", 0)  # as the run's judge had it
    package = Package.open(build(entry_dir, tmp_path / "held.tar.gz", home / "ledger.sqlite"))
    run = next(r for r in package.runs() if r.trial is None)
    assert run.status in ("succeeded", "missed"), run.status
    held = run.details.get("held_tests")
    steps = [row[0] for row in run.evaluations]
    assert held and [h["step"] for h in held] == steps, (held, steps)  # each one held
    assert all(h["bytes"] > 0 for h in held), held
    problems = check(package, rules_dir).problems  # (one seed, no tuning: not complete)
    assert [p for p in problems if not p.startswith("completeness: ")] == [], problems
    records, _ = mllog.parse_text(run.mllog_text)
    training = Training(run, records, rules(run.row["workload_text"], "digits-mlp.yaml"))
    low, high = training.bounds(len(training.evals) - 1)
    assert low < high, (low, high)  # the delays after the held evaluations: paused
    monkeypatch.setattr(heldout, "LIMIT", 1 << 30)  # the same claims under the real LIMIT
    low, high = training.bounds(len(training.evals) - 1)
    assert low == high, (low, high)  # no model of that size: no pause taken
