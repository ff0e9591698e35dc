"""Metric definitions in metrics/: loading by name, validation, aggregation, formatting."""

from __future__ import annotations

import math

import pytest

from d500 import metrics
from d500.errors import ConfigError, D500Error
from d500.leaderboard import environments

AGREED = {"forward_error": "lower", "gradient_error": "lower", "latency": "lower",
          "throughput": "higher", "gflops": "higher", "peak_fraction": "higher",
          "translate_time": "lower", "agreement": "lower", "train_step_time": "lower",
          "time_to_accuracy": "lower", "val_accuracy": "higher", "test_accuracy": "higher"}


def test_every_agreed_metric_is_defined():
    assert set(AGREED) <= set(metrics.names())
    for name, direction in AGREED.items():
        m = metrics.get(name)
        assert m.name == name and m.direction == direction
        assert m.aggregate in metrics.AGGREGATIONS and m.measured and m.description
        assert m.path.name == f"{name}.py"
    assert metrics.get("latency").unit == "s"
    assert metrics.get("time_to_accuracy").missing == math.inf
    assert metrics.get("latency").missing is None


def test_every_metric_file_loads():
    for name in metrics.names():
        m = metrics.get(name)
        assert m.format(1.5)  # its FORMAT works


def test_unknown_metric_names_it_and_the_file():
    with pytest.raises(D500Error, match="unknown metric 'sparkle'"):
        metrics.get("sparkle")
    with pytest.raises(ConfigError, match=r"levels/x\.yaml: unknown metric 'sparkle'"):
        metrics.check(["latency", "sparkle"], "levels/x.yaml")
    with pytest.raises(D500Error, match="unknown metric '../etc'"):
        metrics.get("../etc")


def test_broken_metric_file_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("D500_METRICS", str(tmp_path))
    (tmp_path / "wrongdir.py").write_text(
        'NAME = "wrongdir"\nUNIT = "s"\nDIRECTION = "sideways"\nMEASURED = "x"\n')
    with pytest.raises(ConfigError, match=r"wrongdir\.py: DIRECTION = 'sideways'"):
        metrics.get("wrongdir")
    (tmp_path / "misnamed.py").write_text(
        'NAME = "other"\nUNIT = "s"\nDIRECTION = "lower"\nMEASURED = "x"\n')
    with pytest.raises(ConfigError, match="must equal the file name"):
        metrics.get("misnamed")
    (tmp_path / "energy.py").write_text(
        '"""energy: joules per sample."""\nNAME = "energy"\nUNIT = "J"\nDIRECTION = "lower"\n'
        'MEASURED = "RAPL counters"\nFORMAT = ".1f"\n')
    assert metrics.get("energy").format(2.25) == "2.2 J"
    assert "energy" in metrics.names()


def test_aggregation_is_never_the_best_run():
    vals = [5.0, 1.0, 3.0, 100.0, 4.0]
    assert metrics.aggregate(vals, "median") == 4.0
    assert metrics.aggregate(vals, "olympic_mean") == pytest.approx((3 + 4 + 5) / 3)
    assert metrics.aggregate([2.0, 4.0], "olympic_mean") == 3.0
    assert metrics.aggregate([1.0, math.inf, math.inf], "median") == math.inf
    assert metrics.aggregate([1.0, 2.0, math.inf], "olympic_mean") == 2.0
    assert metrics.aggregate([1.0, math.inf, math.inf, math.inf], "olympic_mean") == math.inf
    assert metrics.aggregate([], "median") is None
    assert metrics.spread(vals) == (1.0, 100.0)
    with pytest.raises(D500Error, match="unknown aggregation 'best'"):
        metrics.aggregate(vals, "best")


def test_direction_orders_and_ratios():
    lat, thr = metrics.get("latency"), metrics.get("throughput")
    assert sorted([3.0, 1.0, None, 2.0], key=lat.sort_key) == [1.0, 2.0, 3.0, None]
    assert sorted([3.0, 1.0, 2.0], key=thr.sort_key) == [3.0, 2.0, 1.0]
    assert lat.best([3.0, 1.5, math.nan]) == 1.5 and thr.best([3.0, 1.5]) == 3.0
    assert lat.ratio_to_best(3.0, 1.5) == 2.0 and thr.ratio_to_best(1.5, 3.0) == 2.0
    assert lat.ratio_to_best(math.inf, 1.5) == math.inf


def test_formatting():
    assert metrics.get("latency").format(1.234e-3) == "1.23 ms"
    assert metrics.get("latency").format(2.5e-6) == "2.5 µs"
    assert metrics.get("time_to_accuracy").format(math.inf) == "∞"
    assert metrics.get("time_to_accuracy").format(7200.0) == "2 h"
    assert metrics.get("gflops").format(12.345) == "12.35 GFLOP/s"
    assert metrics.get("peak_fraction").format(42.0) == "42.0 %"
    assert metrics.get("forward_error").format(None) == "—"


DEPENDENT = {"latency", "backward_latency", "time_to_accuracy", "comm_time", "compute_time",
             "step_time", "train_time", "eval_time", "data_time", "translate_time",
             "first_call_time", "compile_time", "train_step_time", "throughput",
             "samples_per_second", "gflops", "speedup", "scaling_efficiency", "comm_share",
             "peak_fraction", "staleness_max", "bubble_fraction"}


# -- the machine-dependent flag ------------------------------------------------------------------

def test_every_metric_says_whether_it_depends_on_the_machine():
    assert {n for n in metrics.names() if metrics.get(n).machine_dependent} == DEPENDENT
    for name in metrics.names():
        m = metrics.get(name)
        assert "MACHINE_DEPENDENT = " in m.path.read_text()  # decided in each file, not defaulted
        assert environments.machine_dependent(m) is m.machine_dependent
    for name in ("epochs", "steps", "test_accuracy", "bytes_per_step", "compression_ratio",
                 "forward_error", "agreement"):
        assert not environments.machine_dependent(metrics.get(name)), name


def test_bytes_print_with_a_decimal_prefix():
    mem = metrics.get("memory_per_rank")
    assert [mem.format(v) for v in (950, 140152, 1.5e6, 3.2e9)] == [
        "950 B", "140 kB", "1.5 MB", "3.2 GB"]


def test_the_flag_defaults_from_the_unit_and_is_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("D500_METRICS", str(tmp_path))
    body = 'NAME = "{n}"\nUNIT = "{u}"\nDIRECTION = "lower"\nMEASURED = "x"\n{extra}'
    for name, unit, extra, want in (("power", "J/s", "", True), ("energy", "J", "", False),
                                    ("wait_share", "", "MACHINE_DEPENDENT = True\n", True),
                                    ("simulated", "s", "MACHINE_DEPENDENT = False\n", False)):
        (tmp_path / f"{name}.py").write_text(body.format(n=name, u=unit, extra=extra))
        assert metrics.get(name).machine_dependent is want, name
    (tmp_path / "vague.py").write_text(body.format(n="vague", u="", extra='MACHINE_DEPENDENT = '
                                                                            '"yes"\n'))
    with pytest.raises(ConfigError, match=r"vague\.py: MACHINE_DEPENDENT = 'yes' is not valid"):
        metrics.get("vague")
