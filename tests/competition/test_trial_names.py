"""One name per tuning trial (issue 22, item 1): `d500 tune`'s printout, `d500 ledger list`,
`d500 ledger show`, `d500 reproduce` and `d500 check` all call a trial "study S trial T", S the
study's number in the entry's tuning of that workload and backend and T its trial number, both
counted from 0 (the Halton plan's indices), never the ledger's study id. Real runs, real ledgers."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from d500.competition.package import Package
from d500.ledger import Ledger

from .conftest import ROOT
from .packages import draw_seed


def _d500(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "D500_HOME": str(home), "TF_CPP_MIN_LOG_LEVEL": "3", "COLUMNS": "300"}
    return subprocess.run([sys.executable, "-m", "d500.cli", *args], capture_output=True,
                          text=True, timeout=600, cwd=ROOT, env=env, check=False)


@pytest.mark.slow  # d500 tune and reproduce runs: 21 s at load 13
def test_tune_ledger_list_and_show_name_a_trial_alike(digits_home, rules_dir, entry_dir,
                                                      tmp_path):
    home = tmp_path / "home"  # its ledger holds studies 1 and 2 already: the new one is id 3
    shutil.copytree(digits_home, home, ignore=shutil.ignore_patterns("cache"))
    workload = str(rules_dir / "2-training" / "digits-mlp.yaml")
    tuned = _d500(home, "tune", workload, "--submission", str(entry_dir), "--studies", "1",
                  "--trials", "1")
    assert tuned.returncode == 0, tuned.stderr
    printed = re.findall(r"(?m)^(study \d+ trial \d+) .*: run (\d+), ", tuned.stdout)
    assert len(printed) == 1, tuned.stdout
    label, run_id = printed[0][0], int(printed[0][1])
    assert label == "study 0 trial 0"  # the first study of this tuning, its first trial
    with Ledger(home / "ledger.sqlite") as book:
        run = book.get(run_id)
    assert run["study"] == 3 and run["study_number"] == 0 and run["trial"] == 0
    listed = _d500(home, "ledger", "list")
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines()
               if re.match(rf"\W*{run_id} +│", line))
    assert f"({label})" in row, row
    shown = _d500(home, "ledger", "show", str(run_id))
    assert re.search(rf"trial\W+{label}\b", shown.stdout), shown.stdout
    for other in (r for r in json.loads(_d500(home, "ledger", "list", "--json").stdout)
                  if r["study"] is not None and r["study"] != 3):  # the fixture's 2 x 2 trials
        assert (other["study_number"], other["trial"]) in {(0, 0), (0, 1), (1, 0), (1, 1)}


@pytest.mark.slow  # 22 s at load 13
def test_reproduce_and_check_name_a_trial_as_the_ledger_does(digits_package, digits_ledger,
                                                             rules_dir, tmp_path):
    pkg = Package.open(digits_package)
    last = max(r.origin_id for r in pkg.runs() if r.trial is not None)  # study 1's trial 1
    with Ledger(digits_ledger) as book:
        origin = book.get(last)
    label = f"study {origin['study_number']} trial {origin['trial']}"
    assert label == "study 1 trial 1" and origin["study"] == 2
    seed = draw_seed(digits_package, 1, {last})
    done = _d500(tmp_path / "organiser", "reproduce", str(digits_package), "--runs", "1",
                 "--seed", str(seed), "--rules", str(rules_dir), "--json")
    assert done.returncode in (0, 1), done.stderr
    [report] = json.loads(done.stdout)["runs"]
    assert report["origin_run"] == last and report["trial"] == label
    assert f"run {last}: digits-mlp / torch / seed {origin['seed']}, {label}: re-running" \
        in done.stderr

    from d500.competition.completeness import group_studies
    studies, _ = group_studies(pkg.runs(), pkg.studies())
    labels = sorted(s.label for found in studies.values() for s in found.values())
    assert labels == ["study 0", "study 1"]  # check's lines name studies the same way
