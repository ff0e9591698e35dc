"""Issue 17 at level 1, reproduced: the backend of tests/networks/test_clock_attack.py (clocks
halved on import, each training step 10 ms on the real clock), benched honestly in a host of its
own, packaged, and re-run by `d500 reproduce` on the same machine. Were the reproduction's job to
import the backend into its own process, that process would time it with the clock it patched
(its train_step_time read 6.4 ms before 0b73792), and a record forged by the same factor would
agree; the reproduction hosts it as `d500 net bench` does, so it reads the truth."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .test_clock_attack import ROOT, _installed


def _d500(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "d500.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # a bench and a reproduction, each its own d500 process: 12-25 s
def test_a_backend_halving_the_clock_on_import_is_reproduced_at_its_true_step_time(tmp_path):
    env = _installed(tmp_path)
    entry = tmp_path / "entry"
    entry.mkdir()
    (entry / "submission.yaml").write_text("name: tiny\nlevel: 1\ndescription: its clocks "
                                           "halved\n")
    done = _d500(env, "net", "bench", "mlp-mnist", "--backends", "tiny", "--threads", "1",
                 "--budget", "0.5", "--json")
    assert done.returncode == 0, done.stderr
    [run] = json.loads(done.stdout)
    assert run["figures"]["train_step_time"] >= 0.01, run["figures"]  # hosted: the truth
    package = tmp_path / "tiny.tar.gz"
    packed = _d500(env, "package", str(entry), "--out", str(package))
    assert packed.returncode == 0, packed.stderr
    again = _d500(env, "reproduce", str(package), "--runs", "1", "--seed", "0", "--ledger",
                  str(tmp_path / "organiser" / "ledger.sqlite"), "--json")
    assert again.returncode in (0, 1), again.stderr
    [report] = json.loads(again.stdout)["runs"]
    [step] = [c for c in report["checks"] if c["name"] == "train_step_time"]
    assert step["reproduced"] >= 0.01, step  # in the reproduction's own process: ~0.005
