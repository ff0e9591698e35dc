"""`d500 leaderboard` says what it is doing on a terminal's stderr while it works (a big ledger
takes tens of seconds), and nothing where stderr is no terminal; the board itself is untouched."""

from __future__ import annotations

import os
import subprocess
import sys

from d500.ledger import Ledger
from tests.terminal import on_terminal
from tests.test_leaderboard import ROOT, record, write_workload


def _run(args: list[str], env: dict, terminal: bool) -> tuple[int, str, str]:
    """d500 with stderr on a pseudo-terminal (read as it comes, so the terminal never fills)
    or a pipe: (exit code, stdout, stderr)."""
    if not terminal:
        out = subprocess.run([sys.executable, "-m", "d500.cli", *args], capture_output=True,
                             text=True, env=env, cwd=ROOT, timeout=300, check=False)
        return out.returncode, out.stdout, out.stderr
    return on_terminal([sys.executable, "-m", "d500.cli", *args], env, ROOT, stdout=True)


def test_the_leaderboard_shows_its_steps_on_a_terminal_only(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("D500_HOME", str(home))
    wf = write_workload(tmp_path / "conv.yaml", ["latency"])
    record(Ledger(), wf, "mine", "numpy", {"latency": 2e-3})
    env = {**os.environ, "D500_HOME": str(home), "COLUMNS": "200"}
    page = tmp_path / "lb.html"
    code, out, err = _run(["leaderboard", "--format", "html", "--out", str(page)], env, True)
    assert code == 0 and out == f"wrote {page}\n", (out, err)
    for step in ("leaderboard: verifying the ledger", "leaderboard: ranking the runs",
                 "leaderboard: level 0: operators: views", "leaderboard: level 0 · conv: plots"):
        assert step in err, err
    code, out, err = _run(["leaderboard", "--level", "0"], env, False)
    assert code == 0 and err == "" and "| 1 | mine | numpy | 2 ms" in out
    code, out, err = _run(["leaderboard", "--level", "0"], env, True)  # stdout stays the board
    assert code == 0 and "| 1 | mine | numpy | 2 ms" in out and "\x1b" not in out, out
    assert "leaderboard: verifying the ledger" in err
