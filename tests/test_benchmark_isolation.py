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


ECHO = """
import multiprocessing as mp, os, sys, time

def child(conn):
    while True:
        message = conn.recv()
        if message[0] != "train":
            return
        time.sleep(0.02)  # the worker's own chunk
        conn.send(("trained", [0.5]))

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    p = ctx.Process(target=child, args=(theirs,))
    p.start()
    for _ in range(3):
        mine.send(("train", 0))
        mine.recv()
    mine.send(("exit",))
    p.join()
    print(os.getpid())
"""


def test_the_trace_hook_times_each_chunk_from_both_processes(tmp_path):
    import subprocess

    import isolation_trace
    script = tmp_path / "echo.py"
    script.write_text(ECHO)
    trace = tmp_path / "trace"
    trace.mkdir()
    env = {**os.environ, "PYTHONPATH": str(isolation_trace.HERE / "_hook"),
           "D500_TRACE": str(trace)}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=60, check=True)
    chunks = isolation_trace.split(str(trace), int(done.stdout.strip()))
    assert len(chunks) == 3 and len(list(trace.glob("*.tsv"))) == 2  # both processes hooked
    for c in chunks:
        assert 0.019 <= c["own"] < 1.0  # the child's 20 ms, seen between its receipt and reply
        assert 0 <= c["out"] < 0.5 and 0 <= c["back"] < 0.5


def test_the_verdict_shows_the_bound_only_with_a_95_percent_ci():
    """One pair's ratio under 1.02 is its own 'interval' (min-max): never 'shown' (it said
    WITHIN 2 %, shown, for `--pairs 1`); six pairs all under 1.02 are."""
    assert "NOT shown" in isolation.verdict("w", [0.82], 0.82, 0.82)
    assert "WITHIN 2 %, shown" in isolation.verdict("w", [1.0] * 6, 1.0, 1.0)
    assert "NOT within 2 %" in isolation.verdict("w", [1.05] * 6, 1.05, 1.05)
