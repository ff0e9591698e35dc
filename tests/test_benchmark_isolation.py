"""benchmarks/isolation.py's scheduler counts: where a split run's time went."""

import os
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import isolation  # noqa: E402

pytestmark = pytest.mark.skipif(not Path("/proc/self/schedstat").exists(),
                                reason="Linux /proc scheduler statistics")


def _mine() -> dict[str, float]:
    return isolation.counts(os.getpid(), threading.get_native_id())


def test_cpu_time_counts_work_and_not_sleep():
    before = _mine()
    end = time.thread_time() + 0.06
    while time.thread_time() < end:  # 60 ms of this thread's CPU
        pass
    busy = _mine()
    time.sleep(0.05)
    slept = _mine()
    assert 55 <= busy["cpu_ms"] - before["cpu_ms"] < 1000
    assert slept["cpu_ms"] - busy["cpu_ms"] < 10  # a sleep is not CPU time
    assert slept["voluntary"] - busy["voluntary"] >= 1  # ... it is a voluntary switch
    assert {"wait_ms", "nonvoluntary"} <= set(slept)


def test_a_process_that_is_gone_has_no_counts():
    assert isolation.counts(2 ** 22 + 12345) == {}
