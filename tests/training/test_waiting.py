"""d500.training.waiting: a due message's wait blocks, spins a bounded while, blocks again, and
misses no message and no timeout."""

import threading
import time
from multiprocessing import Pipe

from d500.training import waiting
from d500.training.worker import Trainee


def _later(conn, seconds):
    timer = threading.Timer(seconds, conn.send, args=(("trained",),))
    timer.start()
    return timer


def test_no_message_spins_at_most_early_plus_cap_then_times_out():
    mine, theirs = Pipe()
    start, cpu = time.perf_counter(), time.thread_time()
    got = waiting.poll(mine, 0.3, time.perf_counter() + 0.05, cap=0.02)
    took, spun = time.perf_counter() - start, time.thread_time() - cpu
    assert got is False and took >= 0.29
    # the spin: EARLY + 0.02 s of looking at most, the rest asleep (a busy wait would be ~0.3 s)
    assert spun < waiting.EARLY + 0.02 + 0.05, spun
    start, cpu = time.perf_counter(), time.thread_time()  # due within SHORT: spins from now
    assert waiting.poll(mine, 0.3, time.perf_counter() + waiting.SHORT / 2, cap=0.02) is False
    assert time.perf_counter() - start >= 0.29
    assert time.thread_time() - cpu < waiting.SHORT + 0.02 + 0.05


def test_a_message_in_the_blocking_phase_and_one_in_the_spin_are_received():
    mine, theirs = Pipe()
    timer = _later(theirs, 0.02)  # long before it was due: the wait is still blocking
    start = time.perf_counter()
    assert waiting.poll(mine, 5.0, start + 1.0, cap=0.002) is True
    assert time.perf_counter() - start < 0.5 and mine.recv() == ("trained",)
    timer.join()
    timer = _later(theirs, 0.05)  # while it spins (due 0.05 s, spinning from 0.049 to 0.15)
    start = time.perf_counter()
    assert waiting.poll(mine, 5.0, start + 0.05, cap=0.1) is True
    assert mine.recv() == ("trained",)
    timer.join()


def test_a_late_message_is_received_after_the_spin_and_a_timeout_before_due_is_kept():
    mine, theirs = Pipe()
    timer = _later(theirs, 0.1)  # due at once: spins 2 ms, then blocks until it comes
    assert waiting.poll(mine, None, time.perf_counter(), cap=0.002) is True
    timer.join()
    mine.recv()
    start = time.perf_counter()  # the timeout ends the wait before the message is due
    assert waiting.poll(mine, 0.02, start + 1.0) is False
    assert time.perf_counter() - start < 0.5


def test_a_spent_budget_still_stops_a_chunk_whose_end_the_judge_predicted():
    """The judge predicts the second chunk's end from the first's (5 ms); the worker (a thread
    here) then trains until told to stop: the budget's end, 0.1 s on, still sends the stop."""
    mine, theirs = Pipe()
    trainee = Trainee(mine)
    trainee.spin = waiting.CAP

    def worker():
        theirs.recv()
        time.sleep(0.005)
        theirs.send(("trained", [0.5, 0.5], None, False, ""))
        theirs.recv()
        stopped = theirs.poll(10.0) and theirs.recv() == ("stop",)
        theirs.send(("trained", [0.5], None, stopped, ""))

    thread = threading.Thread(target=worker)
    thread.start()
    first = trainee.train(0, 0, 2, lambda: 100.0, None, want=False)
    assert not first.stopped and trainee.step_time is not None
    predicted = trainee.step_time
    end = time.perf_counter() + 0.1
    start = time.perf_counter()
    second = trainee.train(1, 0, 2, lambda: end - time.perf_counter(), None, want=False)
    thread.join()
    assert second.stopped and second.losses == [0.5]
    assert 0.1 <= time.perf_counter() - start < 5.0
    assert trainee.step_time == predicted  # a stopped chunk predicts nothing
