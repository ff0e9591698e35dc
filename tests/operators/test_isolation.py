"""Level 0's entry code runs in an operator host (d500.operators.host), apart from the judge's
clock and reference: an operator file that halves `time.perf_counter` and `time.time` on import
changes no recorded latency, one that patches the reference or the comparison in its own process
passes nothing it should fail, and the judge never imports the file."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from d500 import cli
from d500.ledger import Ledger
from d500.operators.base import load
from tests.training.test_isolation import PEEK, _peeked

from .conftest import ROOT

RELU = ROOT / "levels" / "0-operators" / "relu-4d.yaml"

# Halves the clocks of the process that imports it; each forward sleeps 20 ms on the real clock.
CLOCK = '''
import time
import numpy as np
from d500.operators import CustomOperator

_perf, _wall, _sleep = time.perf_counter, time.time, time.sleep
_p0, _w0 = _perf(), _wall()
time.perf_counter = lambda: _p0 + (_perf() - _p0) / 2
time.time = lambda: _w0 + (_wall() - _w0) / 2


class SlowRelu(CustomOperator):
    op_type = "Relu"
    framework = "numpy"

    def forward(self, x):
        _sleep(0.02)
        return np.maximum(x, 0)

    def backward(self, grad_outputs, inputs, outputs):
        return [grad_outputs[0] * (inputs[0] > 0)]
'''

# Wrong (Relu's negative half let through), and on import it makes every comparison in its own
# process pass: in the judge's process that would hide the error.
FORGER = '''
import numpy as np
from d500.operators import CustomOperator, validate

validate.compare.__code__ = (lambda *a, **k: None).__code__


class LeakyRelu(CustomOperator):
    op_type = "Relu"
    framework = "numpy"

    def forward(self, x):
        return np.where(x > 0, x, 0.5 * x)
'''



def test_an_operator_halving_the_clocks_on_import_changes_no_recorded_latency(home, tmp_path):
    (tmp_path / "slow.py").write_text(CLOCK)
    perf, wall = time.perf_counter, time.time
    code = cli.main(["op", "bench", f"{tmp_path / 'slow.py'}:SlowRelu", "--case", str(RELU),
                     "--backends", "reference", "--budget", "0.5"])
    assert code == 0
    assert time.perf_counter is perf and time.time is wall
    assert not [m for m in sys.modules if m.startswith("d500_user_operator_slow")]
    (mine,) = [r for r in Ledger().runs(level=0) if r["submission"] != "builtin"]
    assert mine["figures"]["latency"] >= 0.02  # at half speed it would read about 0.01


def test_an_operator_file_cannot_read_the_judges_memory(home, tmp_path, monkeypatch):
    """On import, the file reads the memory of every process above its host through /proc:
    the judge (this process), shielded, and the host, confined, leave it none (d500.children)."""
    slow = (Path(__file__).parent / "ops" / "slow_ops.py").read_text()  # a Relu (that sleeps)
    (tmp_path / "peek.py").write_text(PEEK + "\n_look()\n" + slow)
    monkeypatch.setenv("D500_PEEK", str(tmp_path / "peek.jsonl"))
    assert cli.main(["op", "validate", f"{tmp_path / 'peek.py'}:SlowRelu", "--case",
                     str(RELU)]) == 0
    (look,) = _peeked(tmp_path / "peek.jsonl")  # the judge refused, or not even seen (the
    # host's PID namespace has a /proc of its own)
    assert look.get(str(os.getpid()), ["ancestor", "PermissionError"]) == [
        "ancestor", "PermissionError"], look
    assert not [k for k, v in look.items() if k != "self" and v[1] == "read"], look


def test_an_operator_patching_the_comparison_in_its_process_still_fails(home, tmp_path):
    (tmp_path / "forger.py").write_text(FORGER)
    code = cli.main(["op", "validate", f"{tmp_path / 'forger.py'}:LeakyRelu", "--case",
                     str(RELU)])
    assert code == 1  # the check failed: the comparison ran in the judge, unpatched
    (run,) = Ledger().runs(level=0)
    assert run["status"] == "failed" and "disagrees" in (run["error"] or "") + str(
        run["details"])


def test_a_loaded_entry_lives_in_a_host_and_reports_its_class(tmp_path):
    before = set(sys.modules)
    loaded = load(str(ROOT / "submissions" / "numpy-im2col-conv"), isolated=True)
    assert type(loaded.cls).__name__ == "RemoteClass"
    assert (loaded.cls.op_type, loaded.cls.framework) == ("Conv", "numpy")
    assert loaded.submission == "numpy-im2col-conv"
    assert not [m for m in set(sys.modules) - before if m.startswith("d500_user_operator")]
    with pytest.raises(Exception, match="no class 'Nope'"):
        load(f"{ROOT / 'submissions' / 'numpy-im2col-conv' / 'conv.py'}:Nope", isolated=True)
