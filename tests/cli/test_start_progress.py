"""`d500 train` says what it does from its first second on a terminal (it said nothing for the
1-4 s of torch's import, and `mpiexec -n 2 d500 train` nothing for 9 s: both ranks loading torch,
then the judges and workers starting), naming the framework before its import holds the
interpreter; where stderr is no terminal, it stays one line per mistake."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.terminal import on_terminal, screen

MPIEXEC = Path(sys.executable).with_name("mpiexec")
D500 = [sys.executable, "-m", "d500.cli"]


# fp16 is refused on a CPU once the backend's framework has loaded: the steps before are shown
FP16 = ["--precision", "fp16"]


def test_train_names_the_framework_it_loads_on_a_terminal(tmp_path):
    env = {**os.environ, "D500_HOME": str(tmp_path), "COLUMNS": "200"}
    args = ["train", "digits-mlp", "--submission", "sgd-momentum", *FP16]
    code, _, err = on_terminal([*D500, *args], env, tmp_path)
    assert code == 2, err
    for step in ("digits-mlp / sgd-momentum / torch: reading the ledger",
                 "digits-mlp / sgd-momentum / torch: loading torch"):
        assert step in err, err
    assert err.rstrip().endswith("fp16 needs a CUDA device (loss scaling on GPU)"), err
    assert [line for line in screen(err) if line.strip()] == [err.strip().splitlines()[-1]
                                                               .split("\x1b[2K")[-1]], err
    resume = ["train", "digits-mlp", "--submission", "sgd-momentum", "--resume", "5"]
    piped = subprocess.run([*D500, *resume], capture_output=True, text=True, env=env,
                           cwd=tmp_path, timeout=300, check=False)  # a pipe: the one line
    assert piped.returncode == 2 and piped.stderr.count("\n") == 1, piped.stderr
    assert "run 5" in piped.stderr and "\x1b" not in piped.stderr, piped.stderr


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.skipif(not MPIEXEC.exists(), reason="no mpiexec beside Python")
def test_mpiexec_train_shows_rank_0s_steps_where_mpiexec_is_on_a_terminal(tmp_path):
    """A rank's stderr is hydra's pipe; mpiexec's own stderr is the person's terminal."""
    env = {**os.environ, "D500_HOME": str(tmp_path), "COLUMNS": "200"}
    command = [str(MPIEXEC), "-n", "2", *D500, "train", "digits-mlp", "--submission", "sync",
               "--backend", "onnxruntime"]  # refused once the ranks loaded onnxruntime
    code, _, err = on_terminal(command, env, tmp_path)
    assert code == 2, err
    for step in ("d500 train: starting MPI", "d500 train: comparing the 2 ranks' inputs",
                 "d500 train: reading the ledger", "d500 train: loading onnxruntime"):
        assert step in err, err
    assert err.count("backend 'onnxruntime' cannot train") == 2, err  # each rank's line
    assert "\x1b[?25l" not in err  # the cursor never hidden: a killed rank cannot show it again
    # rank 1's line lands while rank 0's spinner may still be drawn: it clears the spinner's
    # line first (it ran on after the spinner's text), and the spinner goes, leaving the two
    shown = [line for line in screen(err) if line.strip()]
    assert len(shown) == 2 and all(line.startswith("[rank ") for line in shown), shown
    typo = [str(MPIEXEC), "-n", "2", *D500, "train", "digits-mpl", "--submission", "sync"]
    piped = subprocess.run(typo, capture_output=True, text=True, env=env, cwd=tmp_path,
                           timeout=300, check=False)  # a pipe: each rank's one line, no more
    lines = piped.stderr.strip().splitlines()
    assert piped.returncode == 2 and len(lines) == 2, piped.stderr
    assert all("did you mean 'digits-mlp'?" in line for line in lines), piped.stderr
    assert "\x1b" not in piped.stderr


def test_conformance_names_the_framework_it_loads_on_a_terminal(tmp_path):
    """Its bar began once the framework had loaded (TensorFlow: 3-5 s of nothing before)."""
    from tests.helpers import seed_node_tests
    seed_node_tests(tmp_path)
    env = {**os.environ, "D500_HOME": str(tmp_path), "COLUMNS": "200"}
    code, _, err = on_terminal([*D500, "conformance", "--backend", "onnxruntime", "--op", "Relu"],
                               env, tmp_path)
    assert code == 0, err
    for step in ("d500 conformance: loading onnxruntime",
                 "d500 conformance: reading onnx's node tests"):
        assert step in err, err


def test_net_check_names_the_framework_it_loads_on_a_terminal(tmp_path):
    """Its own rich spinner stood still while TensorFlow loaded, and said only the backend."""
    import onnx

    from d500.builders import build
    onnx.save(build("mlp", input_shape=[1, 8, 8]), tmp_path / "mlp.onnx")
    env = {**os.environ, "D500_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    code, _, err = on_terminal([*D500, "net", "check", "mlp.onnx", "--backends",
                                "reference,onnxruntime"], env, tmp_path)
    assert code == 0, err
    for step in ("d500 net check: running mlp.onnx on reference",
                 "d500 net check: loading onnxruntime"):
        assert step in err, err


@pytest.mark.mpi
@pytest.mark.skipif(not MPIEXEC.exists(), reason="no mpiexec beside Python")
def test_only_mpiexecs_own_terminal_counts(tmp_path):
    """mpiexec's output captured by a program at a terminal (a test run with `pytest -s`) is no
    terminal: the ranks draw nothing into it (the first ancestor whose stderr was no pipe was
    that program's terminal). mpiexec at the terminal itself: rank 0 draws, rank 1 does not."""
    ask = ("import sys; from d500 import progress; "
           "sys.stderr.write(f'{progress.behind_terminal()} {progress.watched()}\\n')")
    ranks = [str(MPIEXEC), "-n", "2", sys.executable, "-c", ask]
    nested = (f"import subprocess, sys; out = subprocess.run({ranks!r}, capture_output=True, "
              f"text=True); sys.stderr.write(out.stderr)")
    code, _, err = on_terminal([sys.executable, "-c", nested], dict(os.environ), tmp_path)
    assert code == 0 and sorted(err.split()) == ["None"] * 4, err
    code, _, err = on_terminal(ranks, dict(os.environ), tmp_path)
    widths = sorted(err.split())  # each rank: the terminal's width (80 where it says none)
    assert code == 0 and widths[-1] == "None" and widths[:3] == [widths[0]] * 3, err
    assert widths[0].isdigit(), err
