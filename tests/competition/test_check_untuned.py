"""`d500 check` on an entry trained on a second backend but never tuned there (issue 22, item 7):
the completeness line says so, and what to run, instead of "0 of its 0 study(ies) hold the
workload's trials". Real runs on the NumPy reference backend beside the fixture's torch ones."""

from __future__ import annotations

import shutil

import pytest

from .conftest import ENTRY


@pytest.mark.slow  # seed runs: 13 s at load 13
def test_seed_runs_without_tuning_on_a_backend_are_named_as_such(digits_home, rules_dir,
                                                                 entry_dir, run_d500, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(digits_home, home, ignore=shutil.ignore_patterns("cache"))
    workload = str(rules_dir / "2-training" / "digits-mlp.yaml")
    trained = run_d500(home, "train", workload, "--submission", str(entry_dir), "--backend",
                       "reference")
    assert trained.returncode == 0, trained.stdout + trained.stderr
    out = tmp_path / f"{ENTRY}.tar.gz"
    packed = run_d500(home, "package", str(entry_dir), "--out", str(out))
    assert packed.returncode == 0, packed.stderr
    checked = run_d500(None, "check", str(out), "--rules", str(rules_dir))
    assert checked.returncode == 1, checked.stdout + checked.stderr
    lines = [line.split(": ", 1)[1] for line in checked.stdout.splitlines()
             if line.startswith(f"{out}: ")]
    assert lines == [
        "completeness: digits-mlp (level 2) / reference: seed runs on this backend but no tuning "
        "here: every backend an entry has seed runs on needs the workload's full tuning on it "
        "too, 2 studies of 2 trials (`d500 tune` with --backend reference runs them)"], \
        checked.stdout
    assert "0 of its 0 study(ies)" not in checked.stdout
