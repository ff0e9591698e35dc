"""Operators written against the call check's shift (tests/operators/ops/shift_cheats.py): a
MatMul that answers each call's checksum from a cached output, since (x + u) B = x B + u B, and
a Relu that answers from prefix sums over its input sorted once per residue class. Against the
shift before each call got its own window of a 65,521-number pattern and of the weights, both
passed the check and were recorded faster than honest (benchmarks/shift_cheats.py, README; this
test fails on that code); now both answer wrong and are caught."""

from __future__ import annotations

from pathlib import Path

import pytest

from d500 import cli
from d500.ledger import Ledger
from d500.operators import host

from .conftest import ROOT

CHEATS = Path(__file__).parent / "ops" / "shift_cheats.py"
CASES = ROOT / "levels" / "0-operators"


@pytest.mark.parametrize(("name", "case"), [("CachedMatMul", "matmul-batched"),
                                            ("PrefixRelu", "relu-4d")])
def test_a_cheat_on_the_shifts_structure_is_caught_and_recorded_failed(name, case, home,
                                                                       capsys, monkeypatch):
    monkeypatch.setattr(host, "OVERHEAD", 0.5)  # short round trips: a fast test, same checks
    code = cli.main(["op", "bench", f"{CHEATS}:{name}", "--case", str(CASES / f"{case}.yaml"),
                     "--backends", "reference", "--budget", "0.1"])
    (mine,) = [r for r in Ledger().runs(level=0) if r["submission"] != "builtin"]
    assert code == 1 and mine["status"] == "failed", mine
    assert "timed forward call" in mine["error"] and "did not run every call" in mine["error"]
    assert "latency" not in (mine["figures"] or {})
    assert "did not run every call" in capsys.readouterr().err
