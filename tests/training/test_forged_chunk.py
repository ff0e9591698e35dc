"""The worker's answer to a chunk is the entry's to forge: its code runs in the worker and can
patch the pipe. One that sends every chunk's losses twice makes the judge count twice the steps
it asked for, were the answer taken as it came: the run would record twice the samples trained,
so twice the throughput. Worker.train refuses an answer of more steps than asked: the run fails."""

from __future__ import annotations

import pytest

from . import entries

DOUBLE = '''
from multiprocessing import connection
from d500.training.optimizers import Optimizer

_send = connection.Connection.send


def _doubled(self, message):
    if isinstance(message, tuple) and message and message[0] == "trained":
        message = ("trained", list(message[1]) * 2, *message[2:])
    return _send(self, message)


connection.Connection.send = _doubled


class Double(Optimizer):
    name = "double"

    def update(self, ops, params, grads, state, lr, t):
        ops.add_(params, grads, -lr)
'''


@pytest.mark.slow  # (a real run, ~15 s)
def test_a_worker_answering_with_more_steps_than_asked_fails_its_run(home, tmp_path):
    result = entries.run(entries.entry(tmp_path, DOUBLE, "Double", name="double"))
    assert result.status == "failed", (result.status, sorted(result.figures.items()))
    assert "steps for the" in result.error, result.error
