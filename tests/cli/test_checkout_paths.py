"""A new user's paths and run ids: a checkout's paths typed outside it (`d500 train
levels/2-training/digits-mlp.yaml`, `--submission submissions/sgd-momentum`, as the README shows
them, from another folder) say where d500 looked and that its own workload or example entry is
found by its name; `--resume` says what a run id is."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("args, said", [
    (["train", "levels/2-training/digits-mlp.yaml", "--submission", "sgd-momentum"],
     "levels/2-training/digits-mlp.yaml: no such workload file in {cwd} (d500's own "
     "'digits-mlp' is found by its name: give digits-mlp)"),
    (["net", "bench", "levels/1-networks/mlp-mnist.yaml"],
     "no such workload file in {cwd} (d500's own 'mlp-mnist' is found by its name: give "
     "mlp-mnist)"),
    (["train", "digits-mlp", "--submission", "submissions/sgd-momentum"],
     "submissions/sgd-momentum: no such entry (a folder holding submission.yaml, or that file) "
     "in {cwd}; d500's example entry 'sgd-momentum' is found by its name: give sgd-momentum"),
    (["package", "submissions/sgd-momentum", "--out", "p.tar.gz"],
     "submissions/sgd-momentum: no such submission folder in {cwd}; d500's example entry "
     "'sgd-momentum' is found by its name: give sgd-momentum"),
])
def test_a_checkouts_path_outside_it_names_the_name(tmp_path, args, said):
    out = subprocess.run([sys.executable, "-m", "d500.cli", *args], capture_output=True,
                         text=True, cwd=tmp_path, timeout=120, check=False,
                         env={**os.environ, "D500_HOME": str(tmp_path / "home")})
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert said.format(cwd=tmp_path) in out.stderr, out.stderr


def test_a_missing_file_of_no_shipped_name_says_only_that(tmp_path):
    out = subprocess.run([sys.executable, "-m", "d500.cli", "train", "mine.yaml",
                          "--submission", "my-entry/"], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120, check=False,
                         env={**os.environ, "D500_HOME": str(tmp_path / "home")})
    assert out.returncode == 2 and out.stderr.strip().endswith(
        f"my-entry/: no such entry (a folder holding submission.yaml, or that file) in "
        f"{tmp_path}"), out.stderr  # where it was looked for, and no example entry named


@pytest.mark.parametrize("value", ["abc", "0", "-1", "1.5"])
def test_resume_names_what_a_run_id_is(tmp_path, value):
    """argparse's own 'invalid int value' said nothing of what --resume takes."""
    out = subprocess.run([sys.executable, "-m", "d500.cli", "train", "digits-mlp",
                          "--submission", "sgd-momentum", "--resume", value],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
                         env={**os.environ, "D500_HOME": str(tmp_path / "home")})
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert f"--resume: expected a run id (an integer >= 1, as `d500 ledger list` shows them), " \
        f"got '{value}'" in out.stderr, out.stderr
    assert not (tmp_path / "home").exists()  # refused as the command line is read
