"""The README's new-user commands run as written from a directory outside the checkout (issue 22):
example entries found by name (`numpy-im2col-conv`, `--submission lion`, `--submission sync`),
rulebook cases by name, and the case, level-1 workload and Lion entry the README shows, each taken
from the README's own text. Real runs in a fresh D500_HOME."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from d500 import builders
from d500.ledger import Ledger

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def d500(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "D500_HOME": str(cwd / "home"), "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("D500_DATA", None)
    return subprocess.run([sys.executable, "-m", "d500.cli", *args], capture_output=True,
                          text=True, timeout=900, cwd=cwd, env=env, check=False)


def yaml_block(starting: str) -> str:
    """The README's ```yaml block whose first line starts with `starting`."""
    for block in re.findall(r"```yaml\n(.*?)```", README, re.S):
        if block.startswith(starting):
            return block
    raise AssertionError(f"no yaml block starting {starting!r} in the README")


@pytest.fixture
def outside(tmp_path) -> Path:
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    assert not (folder / "submissions").exists() and not (folder / "levels").exists()
    return folder


@pytest.mark.slow  # real d500 runs: 32 s at load 13
def test_level0_entries_and_cases_by_name_and_a_case_file(outside):
    done = d500(outside, "op", "validate", "numpy-im2col-conv", "--case", "conv-3x3-pad1")
    assert done.returncode == 0, done.stdout + done.stderr
    (outside / "my-conv-5x5.yaml").write_text(yaml_block("name: my-conv-5x5"))
    done = d500(outside, "op", "validate", "numpy-im2col-conv", "--case", "my-conv-5x5.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    with Ledger(outside / "home" / "ledger.sqlite") as book:
        assert [r["workload"] for r in book.runs()] == ["conv-3x3-pad1", "my-conv-5x5"]
    wrong = d500(outside, "op", "validate", "no-such-entry")
    assert wrong.returncode == 2 and len(wrong.stderr.strip().splitlines()) == 1, wrong.stderr
    assert "Traceback" not in wrong.stderr


@pytest.mark.slow  # 18 s at load 13
def test_the_level1_workload_file_of_the_readme(outside):
    text = yaml_block("name: my-net")
    assert "file: my-net.onnx" in text and "loss: loss" in text
    import onnx
    onnx.save(builders.build("mlp", "digits", loss=True), outside / "my-net.onnx")
    (outside / "my-net.yaml").write_text(text)
    done = d500(outside, "net", "bench", "my-net.yaml", "--backends", "torch", "--budget", "0.2")
    assert done.returncode == 0, done.stdout + done.stderr
    with Ledger(outside / "home" / "ledger.sqlite") as book:
        [run] = book.runs()
    assert run["workload"] == "my-net" and "train_step_time" in run["figures"]


@pytest.mark.slow  # 41 s at load 13
def test_the_lion_entry_trains_by_name_and_a_level3_entry_is_found_by_name(outside):
    shipped = ROOT / "submissions" / "lion"
    assert (shipped / "submission.yaml").read_text().startswith(
        yaml_block("name: lion").split("\n", 1)[0])
    for line in yaml_block("name: lion").splitlines():  # the README shows the shipped entry
        key = line.split("#")[0].strip()
        assert key in (shipped / "submission.yaml").read_text(), key
    done = d500(outside, "train", "digits-mlp", "--submission", "lion", "--seed", "0",
                "--threads", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"run 1, seed 0, succeeded, time_to_accuracy .*, epochs \d+", done.stdout)
    with Ledger(outside / "home" / "ledger.sqlite") as book:
        [run] = book.runs()
    assert (run["submission"], run["backend"], run["status"]) == ("lion", "torch", "succeeded")
    # level 3 by names, outside an MPI launcher: found at level 3, refused in one line, exit 2
    done = d500(outside, "train", "digits-mlp", "--submission", "sync")
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "is a level-3 (distributed) workload: run it under MPI" in line, line
    done = d500(outside, "train", "digits-mlp", "--submission", "nosuch")
    [line] = done.stderr.strip().splitlines()
    assert done.returncode == 2 and line.startswith(
        "d500 train: error: argument --submission: no entry folder 'nosuch' here, nor an example "
        "entry of that name (adamw, "), line
    assert "lion, " in line and "sgd-momentum, " in line, line


def test_the_readme_operator_of_your_own_is_there_to_copy(outside):
    """The README validated `my_op.py:MyConv`, a file it never showed: a new user's first own
    operator was 'my_op.py: no such file'. Its commands now copy the shipped Conv and validate
    it, as written."""
    block = re.search(r"```\n(d500 op validate numpy-im2col-conv.*?)```", README, re.S)[1]
    [copy] = [line.split("#")[0].split() for line in block.splitlines()
              if line.startswith("cp ")]
    assert copy[1:] == ["submissions/numpy-im2col-conv/conv.py", "my_op.py"], copy
    (outside / copy[2]).write_bytes((ROOT / copy[1]).read_bytes())
    [own] = [line.split("#")[0].split() for line in block.splitlines()
             if line.startswith("d500 op validate my_op.py") and "--input-shape" in line]
    done = d500(outside, *own[1:])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verdict: PASS" in done.stdout, done.stdout
