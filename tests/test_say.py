"""One error line per rank: written whole in one write(2) (a socket that keeps write boundaries
shows it), prefixed with the rank under an MPI launcher, and under a real `mpiexec -n 2` each
rank's line stays its own, run after run."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from d500.distributed import launch
from tests.distributed import level3_jobs as jobs

LINE = "d500 train: error: sync: no such file"


def writes(code: str, **env: str) -> list[bytes]:
    """Each write(2) a child Python makes on fd 2, one message each: its stderr is one end of a
    SOCK_SEQPACKET pair, which keeps the boundaries a pipe would merge."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    clean = {k: v for k, v in os.environ.items()
             if k not in launch.LAUNCHER_VARIABLES and not k.startswith(("PMI_", "MPI_"))}
    with mine:
        with theirs:
            proc = subprocess.Popen([sys.executable, "-c", code], stderr=theirs.fileno(),
                                    env={**clean, **env})
        got = []
        while chunk := mine.recv(65536):
            got.append(chunk)
        assert proc.wait(timeout=60) in (0, 2)
    return got


def test_an_error_line_is_one_write_with_its_newline():
    """print() writes a line's text and its newline in two calls: two ranks writing at once then
    ran together on one line (issue 22); the CLI's line is one write."""
    code = ("import sys; from d500.cli import main; "
            "sys.exit(main(['ledger', 'show', 'not-a-number']))")
    got = writes(code, D500_HOME=os.devnull + "-no-home")
    assert len(got) == 1, got
    assert got[0].startswith(b"d500 ledger: error: ") and got[0].endswith(b"\n")
    assert got[0].count(b"\n") == 1


@pytest.mark.parametrize("env, prefix", [
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, b"[rank 1] "),
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"}, b"[rank 3] "),
    ({"PMI_RANK": "0", "PMI_SIZE": "1"}, b""),  # a world of one: nothing to tell apart
    ({}, b""),
])
def test_under_a_launcher_the_line_names_its_rank(env, prefix):
    got = writes(f"from d500.say import say; say({LINE!r})", **env)
    assert got == [prefix + LINE.encode() + b"\n"]


@pytest.mark.mpi
@pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")
def test_ranks_failing_together_print_one_prefixed_line_each(tmp_path):
    """`mpiexec -n 2 d500 train` with a submission that does not exist, 5 times: each rank's
    line is whole, on its own line, prefixed with its rank (issue 22's joined lines)."""
    home = tmp_path / "home"
    missing = tmp_path / "sync"
    t0 = time.perf_counter()
    for _ in range(5):
        result = jobs.train(home, 2, jobs.LEVEL3 / "digits-mlp.yaml", missing, timeout=120)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.splitlines()
        assert sorted(line[:9] for line in lines) == ["[rank 0] ", "[rank 1] "], result.stderr
        for line in lines:
            assert line.count("error:") == 1 and f"{missing}: no such entry" in line, line
            assert line[9:].startswith("d500 train: error: "), line
    assert time.perf_counter() - t0 < 300


@pytest.mark.mpi
@pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")
def test_a_one_process_command_under_mpiexec_is_each_ranks_one_line(tmp_path):
    """`mpiexec -n 2 d500 net bench ...` ran two benchmarks side by side, each timed beside the
    other, and recorded both; any command but train, tune and scale now stops on every rank."""
    env = {**os.environ, "D500_HOME": str(tmp_path / "home")}
    result = subprocess.run([str(jobs.MPIEXEC), "-n", "2", sys.executable, "-m", "d500.cli",
                             "ledger", "verify"], capture_output=True, text=True, env=env,
                            timeout=120, check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert sorted(line[:9] for line in lines) == ["[rank 0] ", "[rank 1] "], result.stderr
    for line in lines:
        assert line[9:].startswith("d500 ledger: error: it runs in one process, and under "
                                   "mpiexec every rank"), line
        assert "it is for d500 train, tune, scale and benchmark" in line
    assert result.stdout == "" and not (tmp_path / "home").exists()
