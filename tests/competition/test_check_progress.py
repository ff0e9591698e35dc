"""`d500 check` says what it is doing on a terminal's stderr while it works (2.8 s at load 7 for
a 6-run package, silent), and nothing where stderr is no terminal."""

from __future__ import annotations

import os
import subprocess
import sys

from d500.competition.export import build
from d500.ledger import Ledger
from tests.test_leaderboard_progress import _run


def test_check_shows_its_steps_on_a_terminal_only(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("D500_HOME", str(home))
    entry = tmp_path / "mine"
    entry.mkdir()
    (entry / "submission.yaml").write_text("name: mine\nlevel: 0\noperator: op.py:Op\n")
    (entry / "op.py").write_text("")
    case = tmp_path / "conv.yaml"
    case.write_text("name: conv\nlevel: 0\nmetrics: [latency]\nrank_by: latency\n")
    with Ledger() as ledger:
        ledger.start_run(level=0, workload="conv", submission="mine", backend="numpy",
                         workload_file=case).finish("succeeded", figures={"latency": 1e-3})
        package = build(entry, tmp_path / "mine.tar.gz", ledger)
    env = {**os.environ, "D500_HOME": str(home), "COLUMNS": "200"}
    code, out, err = _run(["check", str(package)], env, True)
    assert code in (0, 1) and str(package) in out, (out, err)
    for step in ("d500 check: reading the package", "d500 check: checking it",
                 "d500 check: comparing its code with the entries imported here"):
        assert step in err, err
    piped = subprocess.run([sys.executable, "-m", "d500.cli", "check", str(package)],
                           capture_output=True, text=True, env=env, timeout=300, check=False)
    assert (piped.returncode, piped.stdout) == (code, out.replace("\r\n", "\n"))
    assert "d500 check:" not in piped.stderr, piped.stderr
