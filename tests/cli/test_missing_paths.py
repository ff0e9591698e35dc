"""A relative path that is not there is said with the folder it was looked for in: a script that
ran `cd` elsewhere first was told only 'model.onnx: no such file'."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("args, said", [
    (["net", "check", "model.onnx"], "model.onnx: no such file in {cwd}"),
    (["op", "validate", "my_op.py:Im2colConv"], "my_op.py: no such file in {cwd}"),
    (["op", "validate", "numpy-im2col-conv", "--case", "my-conv.yaml"],
     "my-conv.yaml: no such case file in {cwd}"),
    (["check", "entry.tar.gz"], "entry.tar.gz: no such package file in {cwd}"),
    (["ledger", "import", "/dev/null", "--rules", "my-rules"],
     "--rules my-rules: no such folder in {cwd}"),
    (["check", "/dev/null"], "/dev/null: not a regular file, where a package file goes"),
    (["package", "./my-entry", "--out", "e.tar.gz"],
     "my-entry: no such submission folder in {cwd}"),
    (["ledger", "--ledger", "ledger.sqlite", "list"],
     "--ledger ledger.sqlite: no such ledger file in {cwd}"),
    (["train", "digits-mlp", "--submission", "./my-entry"],
     "./my-entry: no such entry (a folder holding submission.yaml, or that file) in {cwd}")])
def test_a_missing_relative_path_names_the_folder_looked_in(args, said, tmp_path):
    done = subprocess.run([sys.executable, "-m", "d500.cli", *args], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120, check=False,
                          env={**os.environ, "D500_HOME": str(tmp_path / "home")})
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.endswith(said.format(cwd=tmp_path) + "\n"), done.stderr


def test_a_missing_inputs_or_key_file_names_the_folder_looked_in(tmp_path, monkeypatch):
    from d500.builders import build
    from d500.competition import signing
    from d500.errors import UsageError
    from d500.networks.inputs import load_npz
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=rf"^x.npz: no such inputs file in {tmp_path}$"):
        load_npz("x.npz", build("mlp", input_shape=[1, 8, 8]))
    with pytest.raises(UsageError, match=rf"^me.key: no such key file in {tmp_path}$"):
        signing.public_key("me.key")


def test_a_file_given_as_the_rulebook_is_said_to_be_a_file(tmp_path):
    (tmp_path / "rules").write_text("")
    done = subprocess.run([sys.executable, "-m", "d500.cli", "ledger", "import", "/dev/null",
                           "--rules", "rules"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120, check=False,
                          env={**os.environ, "D500_HOME": str(tmp_path / "home")})
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.endswith("--rules rules: a file, not a folder\n"), done.stderr


def test_an_absolute_path_is_said_as_it_is(tmp_path):
    from d500.paths import looked_in
    assert looked_in(tmp_path / "x.onnx") == ""
    assert looked_in("x.onnx") == f" in {os.getcwd()}"
    assert looked_in("~/x.onnx") == (f" in {os.getcwd()} (~ was not expanded: the shell expands "
                                     f"it unquoted only, to {os.path.expanduser('~/x.onnx')})")
    assert looked_in("~no-such-user-h/x") == f" in {os.getcwd()}"


@pytest.mark.parametrize("args, said", [
    (["leaderboard", "--out", ""], "argument --out: is empty: give a file name"),  # board: stdout
    (["package", "sgd-momentum", "--out", ""], "argument --out: is empty"),  # '.: is a folder'
    (["keygen", ""], "argument KEYFILE: is empty"),
    (["ledger", "--ledger", "", "list"], "argument --ledger: is empty: give a ledger file"),
    (["check", ""], "argument package: is empty: give a package file"),
    (["net", "check", ""], "argument model: is empty: give an ONNX file"),
    (["op", "validate", ""], "argument operator: is empty"),  # './submission.yaml: no such'
    (["scale", "1", "--png", ""], "argument --png: is empty")])
def test_an_empty_path_is_said_empty(args, said, tmp_path):
    """`--out "$OUT"` with OUT unset: '' was read as the current folder, or as no --out."""
    done = subprocess.run([sys.executable, "-m", "d500.cli", *args], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120, check=False,
                          env={**os.environ, "D500_HOME": str(tmp_path / "home")})
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and done.stdout == "", done
    assert said in done.stderr, done.stderr
