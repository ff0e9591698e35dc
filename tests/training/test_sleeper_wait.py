"""d500.training.cpu records, as woken_s, the part of a sleeper's wait for a CPU over the wait per
second run of all the live threads (a thread woken often to run a few us waits the machine's
wake-up latency each time: gloo's pt_gloo_runloop under DDP), and counts every wait whole: leaving
woken_s out let test_entry_threads' tensorflow attack pass on a quiet machine. A thread computing,
or chopped into short runs by yields (taken off its CPU, not sleeping), has no woken_s."""

from __future__ import annotations

from d500.training import cpu

MAIN = (0.0, 0.0, 0, 0, 0)


def _reading(threads: dict[int, tuple[float, float, int, int, int]]) -> cpu.Reading:
    return sum(t[0] for t in threads.values()), threads


def test_a_sleepers_wait_over_the_wait_per_second_run_of_all_is_recorded_and_counted():
    start = _reading({1: MAIN, 2: MAIN})
    # the main thread: 0.3 s run in 300 times (1 ms each), 0.3 s waited; gloo's runloop: 8 ms
    # run in 600 wake-ups (13 us each), 0.2 s waited (25 s a s run)
    end = _reading({1: (0.3, 0.3, 300, 150, 150), 2: (0.008, 0.2, 600, 550, 50)})
    got = cpu.runnable(start, end)
    per = 0.5 / 0.308
    assert abs(got["waited_s"] - 0.5) < 1e-9, got  # whole
    assert abs(got["woken_s"] - (0.2 - 0.008 * per)) < 1e-9, got
    assert abs(got["runnable_s"] - (0.308 + got["waited_s"])) < 1e-9, got


def test_a_thread_computing_or_yielding_counts_its_whole_wait():
    start = _reading({1: MAIN, 2: MAIN, 3: MAIN})
    end = _reading({1: (0.3, 0.1, 300, 290, 10),       # the main thread, waiting little
                    2: (0.3, 1.2, 200, 0, 200),        # an extra thread computing, 1.5 ms a time
                    3: (0.03, 0.6, 300, 0, 300)})      # one yielding every 100 us
    got = cpu.runnable(start, end)
    assert got["woken_s"] == 0.0 and abs(got["waited_s"] - 1.9) < 1e-9, got


def test_readings_without_switches_count_every_wait():
    start = _reading({1: (0.0, 0.0), 2: (0.0, 0.0)})
    end = _reading({1: (0.3, 0.3), 2: (0.008, 0.2)})
    got = cpu.runnable(start, end)
    assert got["woken_s"] == 0.0 and abs(got["waited_s"] - 0.5) < 1e-9, got
