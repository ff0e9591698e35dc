"""d500.children.cpu_seconds reads a live process's CPU time from its CPU clock, to the
nanosecond, its ended threads' too: their CPU time is what d500.training.cpu charges for the wait
they took with them, and /proc's ticks (10 ms) read each process's up to a tick off, a slack an
entry could compute in (tests/training/test_burst_threads.py). Measured on a real child process:
a thread that computed a known CPU time and ended is read to within 1 ms."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from d500 import children

CHILD = r'''
import sys, threading, time


def burn(share, out):
    began = time.thread_time()
    while time.thread_time() - began < share:
        pass
    out.append(time.thread_time() - began)


for share in (0.0137, 0.0041):
    print("ready", flush=True)
    sys.stdin.readline()
    spent = []
    one = threading.Thread(target=burn, args=(share, spent))
    one.start()
    one.join()
    print(spent[0], flush=True)
'''


@pytest.mark.skipif(sys.platform != "linux"
                    or not os.path.exists(f"/proc/self/task/{os.getpid()}/schedstat"),
                    reason="/proc's schedstat and CPU clocks")
def test_an_ended_threads_cpu_time_is_read_exactly():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(2):
            assert child.stdout.readline() == "ready\n"
            before = children.cpu_seconds(child.pid)  # the child waits on its stdin: no thread
            child.stdin.write("\n")                   # of it runs while it is read
            child.stdin.flush()
            burned = float(child.stdout.readline())
            deadline = time.monotonic() + 10
            while len(os.listdir(f"/proc/{child.pid}/task")) > 1:  # joined, and gone from /proc
                assert time.monotonic() < deadline
                time.sleep(0.001)
            after = children.cpu_seconds(child.pid)
            main = [t for t in after[1] if t in before[1]]
            assert main and set(after[1]) == set(before[1]), (before, after)  # it ended
            ran = sum(after[1][t][0] - before[1][t][0] for t in main)
            assert abs(after[0] - before[0] - ran - burned) < 0.001, (before, after, burned)
    finally:
        child.kill()
        child.wait()
