"""d500.timing: warm-up, repetitions until the CI of the median is tight or the budget ends."""

from __future__ import annotations

import time

import pytest

from d500.timing import measure, measure_interleaved, median_ci


def test_median_ci_uses_order_statistics():
    xs = [float(i) for i in range(1, 101)]  # n = 100: the 95% CI is (x_40, x_61)
    assert median_ci(xs) == (40.0, 61.0)
    assert median_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)  # too few samples: the whole range


def test_measure_times_a_sleep_and_stops_when_the_ci_is_tight():
    t = measure(lambda: time.sleep(0.004), budget=3.0, rel_ci=0.5, time_first=True)
    assert 0.004 <= t.median < 0.05
    lo, hi = t.ci
    assert lo <= t.median <= hi
    assert t.target_met and not t.budget_exhausted and t.repetitions >= 6
    assert t.first_call is not None and t.warmup >= 2
    summary = t.summary()
    assert summary["repetitions"] == t.repetitions and summary["ci95"] == [lo, hi]


def test_fast_calls_are_batched_per_sample_and_reported_per_call():
    calls = []
    t = measure(lambda: calls.append(1), budget=0.2, min_sample=1e-3)
    assert t.number > 1 and t.median < 1e-4
    assert len(calls) >= t.number * t.repetitions


def test_the_budget_ends_a_noisy_measurement():
    delays = iter([0.001, 0.02] * 1000)
    t = measure(lambda: time.sleep(next(delays)), budget=0.3, rel_ci=0.001, warmup=0,
                warmup_time=0)
    assert t.budget_exhausted and not t.target_met and 3 <= t.repetitions < 40


def test_interleaved_gives_each_its_own_timing_and_errors_propagate():
    order = []

    def make(name, delay):
        def fn():
            order.append(name)
            time.sleep(delay)
        return fn

    timings = measure_interleaved({"fast": make("fast", 0.001), "slow": make("slow", 0.005)},
                                  budget=0.5, rel_ci=0.5, warmup=1, warmup_time=0)
    assert set(timings) == {"fast", "slow"}
    assert timings["fast"].median < timings["slow"].median
    assert "fast" in order[order.index("slow"):]  # samples alternate, not one block each

    def boom():
        raise RuntimeError("kaput")

    with pytest.raises(RuntimeError, match="kaput"):
        measure_interleaved({"ok": make("ok", 0), "bad": boom}, budget=0.1)
