"""A workload named on the command line where the current folder holds a folder: a name is
still found, and a folder given as the workload is said to be a folder (it read 'no such
workload file', about a path that plainly exists)."""

from __future__ import annotations

import os
import subprocess
import sys

from d500.levels import get


def test_a_folder_named_like_a_workload_does_not_hide_the_workload(tmp_path, monkeypatch):
    (tmp_path / "digits-mlp").mkdir()  # the user's own folder for their digits-mlp runs
    monkeypatch.chdir(tmp_path)
    assert get(2).find("digits-mlp") == get(2).rulebook() / "digits-mlp.yaml"


def test_a_folder_given_as_the_workload_is_said_to_be_a_folder(tmp_path):
    env = {**os.environ, "D500_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-m", "d500.cli", "train", str(tmp_path),
                           "--submission", "sgd-momentum"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120, check=False)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"{tmp_path}: a folder, where a level-2 workload's file or name" in done.stderr


def test_a_level3_job_digests_the_workload_not_a_folder_of_its_name(tmp_path, monkeypatch):
    """Every rank of `mpiexec d500 train digits-mlp` digests the workload file to agree on it;
    a digits-mlp/ folder in the current folder was digested whole in its place."""
    import argparse

    from d500.distributed.cli import _workload_file
    from d500.paths import examples
    (tmp_path / "digits-mlp").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    args = argparse.Namespace(workload="digits-mlp", submission=str(examples() / "sync"),
                              data=None)
    assert _workload_file(args) == get(3).rulebook() / "digits-mlp.yaml"


def test_scale_finds_a_workload_by_name_beside_a_folder_of_its_name(tmp_path):
    (tmp_path / "digits-mlp").mkdir()
    from d500.ledger import Ledger
    Ledger(tmp_path / "home" / "ledger.sqlite").close()  # one without the run (scale only reads)
    env = {**os.environ, "D500_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-m", "d500.cli", "scale", "digits-mlp"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
                          check=False)
    assert "no succeeded level-3 run of 'digits-mlp'" in done.stderr, done.stderr  # by name


def test_an_onnx_model_given_as_the_workload_is_said_so(tmp_path):
    """`d500 net bench model.onnx` said 'model.onnx: not a text file'."""
    import onnx

    from d500.builders import build
    onnx.save(build("mlp", input_shape=[1, 8, 8]), tmp_path / "m.onnx")
    env = {**os.environ, "D500_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-m", "d500.cli", "net", "bench", "m.onnx"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
                          check=False)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("d500 net: error: m.onnx: an ONNX model, where a level-1 "
                                  "workload's name or YAML file goes (`d500 net check m.onnx` "
                                  "checks a model file"), done.stderr
