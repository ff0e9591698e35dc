"""Test accuracy is measured after the run, on the models the judge kept, so its clock is never
paused while the entry's code runs (d500.training.heldout). Where it cannot wait (before a
checkpoint, or kept models over heldout.LIMIT) the judge pauses its clock and measures it at
once. The worker is idle then, waiting for its next chunk, but the entry's code is not bound to
wait with it: a thread it starts can keep computing (extra steps on the batches it has seen) on
time that no figure counts. The attack, performed: a thread that notes the time every ~1 ms
while it runs, against the judge's test evaluations timed from this process."""

from __future__ import annotations

import json
import sys
import time

import pytest

from d500.training import heldout, submission, trainer

from . import entries

# From its first update on, a thread computes without pause and notes when it ran (the times of
# its loop, every ~1 ms) in $D500_BUSY, rewritten every 5 ms.
BUSY = '''
import json, os, threading, time
import numpy as np
from d500.training.optimizers import Optimizer

_started = []


def _busy():
    seen, a, last = [], np.ones((16, 16)), 0.0
    while True:
        a = a @ a / 16  # a stand-in for extra steps on cached batches
        time.sleep(1e-3)  # (light: the run itself is not slowed)
        now = time.perf_counter()
        if now - (seen[-1] if seen else 0.0) >= 2e-4:
            seen.append(now)
        if now - last >= 0.005:  # (the folder goes once the test ends)
            with open(os.environ["D500_BUSY"] + ".new", "w") as out:
                json.dump(seen, out)
            os.replace(os.environ["D500_BUSY"] + ".new", os.environ["D500_BUSY"])
            last = now


class Busy(Optimizer):
    name = "busy"

    def update(self, ops, params, grads, state, lr, t):
        if not _started and int(t) == 1:
            _started.append(threading.Thread(target=_busy, daemon=True).start())
        ops.add_(params, grads, -lr)
'''


@pytest.mark.slow  # (a real run, 15-30 s at load 6)
@pytest.mark.skipif(sys.platform != "linux", reason="one monotonic clock across processes")
def test_the_entry_computes_nothing_while_the_clock_is_paused(home, tmp_path, monkeypatch):
    entry = entries.entry(tmp_path, BUSY, "Busy", name="busy")
    busy = tmp_path / "busy.json"
    monkeypatch.setenv("D500_BUSY", str(busy))
    monkeypatch.setattr(heldout, "LIMIT", 0)  # every test accuracy at once, the clock paused
    paused: list[tuple[float, float]] = []
    calls = []
    measure = trainer.QUALITY["accuracy"]

    def timed(predict, x, y):  # every second call of an evaluation is the test split's
        t = time.perf_counter()
        value = measure(predict, x, y)
        calls.append((t, time.perf_counter()))
        return value

    monkeypatch.setitem(trainer.QUALITY, "accuracy", timed)
    result = entries.run(entry)
    if result.status == "failed":  # its thread is one the run does not record: on a loaded
        # machine, waking every ~1 ms, it waits runnable for a CPU much of the time, and the
        # CPU meter may fail the run first (1.57x of 1.3, once in CI): caught, gaining nothing
        assert result.error.startswith("the worker's threads were runnable"), result.error
        return
    assert result.status in ("succeeded", "missed"), result.error
    paused = calls[1::2]
    assert paused
    seen = json.loads(busy.read_text())
    assert seen, "the thread never ran"
    during = [s for s in seen if any(a <= s <= b for a, b in paused)]
    assert not during, (f"the entry's thread ran {len(during)} times while the clock was "
                        f"paused ({sum(b - a for a, b in paused) * 1e3:.1f} ms paused; "
                        f"figures {result.figures})")


def test_the_clock_is_never_paused_while_the_entry_runs(home, tmp_path, monkeypatch):
    """By default every test accuracy is measured once the run is over: its clock never paused
    (nothing to hold), each evaluation's row written after the last validation, with its own
    test accuracy and the time of its evaluation."""
    clocks, calls = [], []
    measure = trainer.QUALITY["accuracy"]

    class Watched(trainer.Clock):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            clocks.append(self)

    def timed(predict, x, y):  # the split it measures, by its labels
        calls.append((y.tobytes(), measure(predict, x, y)))
        return calls[-1][1]

    monkeypatch.setattr(trainer, "Clock", Watched)
    monkeypatch.setitem(trainer.QUALITY, "accuracy", timed)
    result = entries.run(submission.load(entries.SGD), epochs=3)
    assert result.status in ("succeeded", "missed"), result.error
    (clock,) = clocks
    assert clock.paused == 0.0
    splits = [labels for labels, _ in calls]
    n = len(calls) // 2
    assert n >= 2 and len(set(splits[:n])) == 1 and len(set(splits[n:])) == 1
    assert splits[0] != splits[-1]  # n validations, then n tests
    from d500.ledger import Ledger
    rows = Ledger().evaluations(result.run_id)
    assert [r["metrics"]["test_accuracy"] for r in rows] == [v for _, v in calls[n:]]
    assert [r["metrics"]["val_accuracy"] for r in rows] == [v for _, v in calls[:n]]
    assert result.figures["final_test_accuracy"] == calls[-1][1]


def test_a_run_stopped_while_its_tests_are_measured_keeps_its_rows(home, monkeypatch):
    """Stopped (^C, an exit) while it measures the kept models after the run, the run keeps
    every evaluation's row: those measured with their test accuracy, the rest without."""
    measure, seen = trainer.QUALITY["accuracy"], []

    def stopped(predict, x, y):
        seen.append(y.tobytes())
        if len(set(seen)) == 2 and seen.count(seen[-1]) == 2:  # the second test split's
            raise SystemExit(130)
        return measure(predict, x, y)

    monkeypatch.setitem(trainer.QUALITY, "accuracy", stopped)
    with pytest.raises(SystemExit):
        entries.run(submission.load(entries.SGD), epochs=3)
    from d500.ledger import Ledger
    (run,) = Ledger().runs()
    rows = Ledger().evaluations(run["id"])
    assert len(rows) >= 2 and all("val_accuracy" in r["metrics"] for r in rows)
    assert ["test_accuracy" in r["metrics"] for r in rows] == [True] + [False] * (len(rows) - 1)
