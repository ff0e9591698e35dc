"""Only the judge ends a chunk early. A chunk the worker answers with fewer steps than asked
ends the run, and the judge evaluates the model at the step it ended on (the run's last
evaluation): were the worker free to end a chunk, the entry's code would choose that step. An
entry guessing where its model meets the target (from its training loss, say) would stop there
and be evaluated mid-epoch, between the workload's evaluations, and reach the target sooner than
the same computation run honestly: on digits-mlp (an evaluation each epoch, plain SGD at lr 0.1,
seed 0) the honest run met 0.97 at its 13th evaluation, step 481; the same run stopped at step
470 met it there. The entry's code runs in the worker and can answer for it: here it makes the
worker's loop believe the judge said stop (its pipe's poll and recv patched). Worker.train
refuses a short chunk it never stopped, unless its last loss is not finite (the judge's
divergence), and a chunk said stopped that it never stopped."""

from __future__ import annotations

import math
import multiprocessing
import threading

import pytest

from d500.training import worker

from . import entries

# From its 47th step (mid-epoch 2 of 37-step epochs, where no evaluation is due), the worker's
# pipe says the judge sent stop: the worker's loop ends the chunk and answers its 47 steps.
SHORT = '''
import time
from multiprocessing import connection
from d500.training.optimizers import Optimizer

_poll, _recv = connection.Connection.poll, connection.Connection.recv
_armed = []


def _polled(self, timeout=0.0):
    return True if _armed else _poll(self, timeout)


def _received(self):
    if _armed:
        _armed.clear()
        return ("stop",)
    return _recv(self)


connection.Connection.poll = _polled
connection.Connection.recv = _received


class Short(Optimizer):
    name = "short"

    def update(self, ops, params, grads, state, lr, t):
        if int(t) == 47:  # the entry's own guess that the target is met here
            _armed.append(True)
            time.sleep(0.01)  # (the worker looks for a stop every POLL s)
        ops.add_(params, grads, -lr)
'''


@pytest.mark.slow  # (a real run, ~10 s)
def test_an_entry_ending_a_chunk_early_fails_its_run(home, tmp_path):
    result = entries.run(entries.entry(tmp_path, SHORT, "Short", name="short"), epochs=3)
    assert result.status == "failed", (result.status, sorted(result.figures.items()))
    assert "never told to stop" in result.error, result.error


class Pipe(worker.Trainee):
    """The judge's side of the protocol over a real pipe; the test plays the worker."""

    def close(self) -> None:
        self.conn.close()


def answered(answer: tuple, remaining: float = 60.0) -> worker.Chunk:
    """The judge's chunk of 10 steps, answered by the worker's side with `answer`."""
    judge, trainee = multiprocessing.Pipe()

    def play() -> None:
        trainee.recv()  # ("train", ...)
        if remaining <= 0:
            assert trainee.recv() == ("stop",)
        trainee.send(answer)

    side = threading.Thread(target=play, daemon=True)
    side.start()
    try:
        return Pipe(judge).train(0, 0, 10, lambda: remaining, None, want=False)
    finally:
        side.join(5)
        trainee.close()


def test_a_chunk_the_worker_ended_early_is_refused():
    with pytest.raises(worker.WorkerError, match="after 4 of the 10 steps .* never told to stop"):
        answered(("trained", [0.5] * 4, None, False, ""))


def test_a_whole_chunk_said_stopped_without_a_stop_is_refused():
    with pytest.raises(worker.WorkerError, match="never told to stop"):
        answered(("trained", [0.5] * 10, None, True, ""))


def test_a_chunk_ending_in_a_non_finite_loss_may_be_short():
    chunk = answered(("trained", [0.5, math.nan], None, False, ""))
    assert len(chunk.losses) == 2 and not chunk.stopped


def test_a_chunk_the_judge_stopped_may_be_short():
    chunk = answered(("trained", [0.5] * 3, None, True, ""), remaining=0.0)
    assert len(chunk.losses) == 3 and chunk.stopped
