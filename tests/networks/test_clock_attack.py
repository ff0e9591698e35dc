"""Issue 17 at level 1: a backend (the entry of level 1, a package registered as an entry point)
that halves the process's clocks on import, and whose training step sleeps 10 ms on the real
clock, so that its true step time is known from below. Its code runs in d500's own process,
which times it with the clocks it patched: the recorded train_step_time is about half the
truth when its code shares d500's process. A backend that is not d500's own now runs in a host
process of its own, timed in round trips from the judge's side (d500.networks.hosted): its
patched clock times nothing (fails with the backend imported in d500's process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import install_plugin

ROOT = Path(__file__).resolve().parents[2]

# the reference evaluator under another name: clocks halved on import, each training step 10 ms
PLUGIN = '''
import time

from d500.backends.hooks import Framework
from d500.backends.reference import ReferenceBackend

_perf, _sleep = time.perf_counter, time.sleep
_p0 = _perf()
time.perf_counter = lambda: _p0 + (_perf() - _p0) / 2


class Tiny(Framework):
    pass


FRAMEWORK = Tiny("tiny", module="tinyfw", distribution="tinyfw", tie_rank=-1,
                 optimizer_ops="d500.backends.reference.optimizer_ops")


class TinyBackend(ReferenceBackend):
    name = "tiny"
    about = "the reference evaluator, its clocks halved"

    @classmethod
    def prepare(cls, model, *args, **kwargs):
        exe = super().prepare(model, *args, **kwargs)
        real = exe.gradients

        def slow(*a, **k):
            _sleep(0.01)
            return real(*a, **k)
        exe.gradients = slow
        return exe
'''


def _installed(tmp_path: Path) -> dict[str, str]:
    """The plugin installed under tmp_path; the environment of a d500 command that finds it."""
    return install_plugin(tmp_path, "tinyfw", PLUGIN, {"tiny": "TinyBackend"}, version="1.2.3")


@pytest.mark.slow  # 10 s at load 13
def test_a_backend_halving_the_clock_on_import_changes_no_recorded_step_time(tmp_path):
    env = _installed(tmp_path)
    done = subprocess.run([sys.executable, "-m", "d500.cli", "net", "bench", "mlp-mnist",
                           "--backends", "tiny", "--threads", "1", "--budget", "0.5", "--json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    [run] = json.loads(done.stdout)
    assert run["status"] == "succeeded", run
    assert run["figures"]["train_step_time"] >= 0.01, run["figures"]  # halved: about 0.005


@pytest.mark.slow  # 12 s at load 13
def test_d500_run_records_its_true_step_time_too(tmp_path):
    """`d500 run` of level 1: its net check and net bench host the backend (d500.runner)."""
    env = _installed(tmp_path)
    done = subprocess.run([sys.executable, "-m", "d500.cli", "run", "--level", "1", "--quick",
                           "--backends", "tiny", "--threads", "1", "--quiet-wait", "0"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    found = subprocess.run([sys.executable, "-c", (
        "import json; from d500.ledger import Ledger; print(json.dumps([r['figures'] for r in "
        "Ledger().runs(level=1, workload='mlp-mnist')]))")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    [figures] = json.loads(found.stdout)
    assert figures["train_step_time"] >= 0.01, figures  # halved: about 0.005
