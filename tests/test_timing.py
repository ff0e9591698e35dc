"""d500.timing: warm-up, repetitions until the CI of the median is tight or the budget ends."""

from __future__ import annotations

import time

import pytest

from d500 import timing
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


def test_repetitions_that_spread_widely_are_marked_unstable_on_the_board(tmp_path, monkeypatch):
    """A call that takes 1 ms or 6 ms by turns is unstable (its interquartile range is most of
    its median, as pyperf would warn); a row timed so says it, with a note under the table."""
    from d500.leaderboard import ranking, render, text
    from d500.ledger import Ledger

    calls = iter(range(10**6))
    jumpy = timing.measure(lambda: time.sleep(0.001 if next(calls) % 2 else 0.006),
                           budget=0.3, warmup_time=0.0)
    assert timing.unstable(jumpy.summary())
    assert not timing.unstable(timing.Timing([0.01, 0.0101, 0.0099, 0.01]).summary())
    monkeypatch.setenv("D500_HOME", str(tmp_path))
    wf = tmp_path / "net.yaml"
    wf.write_text("name: net\nlevel: 1\nmetrics: [latency]\nrank_by: latency\n")
    ledger = Ledger()
    steady = timing.Timing([0.004, 0.0041, 0.0039, 0.004])
    for backend, t in (("onnxruntime", steady), ("torch", jumpy)):
        with ledger.start_run(level=1, workload="net", submission=backend, backend=backend,
                              workload_file=wf) as run:
            run.record(figures={"latency": t.median}, details={"latency": t.summary()})
    [board] = ranking.build(ledger, level=1)
    cells = {e.backend: text.row(board, e)[3] for e in board.entries}
    assert cells["torch"].endswith("~unstable") and "unstable" not in cells["onnxruntime"]
    md = render(ledger, level=1, fmt="md")
    assert ("~unstable: a run's timed repetitions spread widely (interquartile range above 10% "
            "of the median)") in md
