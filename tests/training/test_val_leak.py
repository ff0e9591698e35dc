"""The worker never learns a figure of the validation split: the judge's "train" message carried
the last validation accuracy (for a progress display the level-2 worker never shows), so the
entry's code, which reads the worker's pipe, learned every evaluation's score on the held-out
split, enough to select on it (hand over a perturbed model, keep what scored). The attack,
performed: an optimizer file that records what the worker receives."""

from __future__ import annotations

import json

import pytest

from . import entries

LISTEN = '''
import json, os
from multiprocessing import connection
from d500.training.optimizers import Optimizer

_recv = connection.Connection.recv


def _heard(self):
    message = _recv(self)
    if isinstance(message, tuple) and message and message[0] == "train":
        with open(os.environ["D500_HEARD"], "a") as out:
            out.write(json.dumps(message[5]) + "\\n")  # the val the judge sent
    return message


if not hasattr(connection.Connection, "_heard"):  # (the file may be imported twice)
    connection.Connection._heard = True
    connection.Connection.recv = _heard


class Listen(Optimizer):
    name = "listen"

    def update(self, ops, params, grads, state, lr, t):
        ops.add_(params, grads, -lr)
'''


@pytest.mark.slow  # (a real run of 3 epochs, ~10 s)
def test_the_worker_hears_no_validation_figure(home, tmp_path, monkeypatch):
    heard = tmp_path / "heard.jsonl"
    monkeypatch.setenv("D500_HEARD", str(heard))
    result = entries.run(entries.entry(tmp_path, LISTEN, "Listen", name="listen"), epochs=3)
    assert result.status in ("succeeded", "missed"), result.error
    said = [json.loads(line) for line in heard.read_text().splitlines()]
    assert len(said) == 3 and said == [None] * 3, said  # (before: [None, 0.807, 0.867])
