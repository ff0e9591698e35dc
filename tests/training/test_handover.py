"""The model handed over through shared memory (d500.training.handover): the judge evaluates a
copy of its own, a worker that writes the board while the judge copies it fails its run, one
that writes after the copy changes nothing judged, and the file cannot be resized under the
judge's mapping; the training split goes to the worker on a shelf of its own, written only once
given (after the clock), the judge's arrays its own; a real run hands its model and its data over
there and reaches the same accuracies as through the pipe."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from d500.ledger import Ledger
from d500.training import handover, trainer, workloads
from d500.training.worker import Trainee, WorkerError

from . import entries
from .entries import MLP, SGD

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="no memfd here")

SHAPES = {"w": (3, 5), "b": (5,), "n": ()}
DTYPES = {"w": np.float32, "b": np.float32, "n": np.int64}


def _state(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((3, 5)).astype(np.float32),
            "b": rng.standard_normal(5).astype(np.float32), "n": np.array(seed, np.int64)}


class _Judge(Trainee):
    """The judge's side of the protocol over a real pipe, the test playing the worker."""

    def close(self) -> None:
        pass


def test_a_handed_over_model_is_the_judges_own_copy_and_later_writes_change_nothing():
    board = handover.Board.create(SHAPES, DTYPES)
    ours, theirs = multiprocessing.Pipe()
    judge = _Judge(ours)
    judge.board = board
    sent = _state(1)
    assert board.put(sent)
    theirs.send(("trained", [0.5], handover.SHARED, False, ""))
    chunk = judge.train(0, 0, 1, lambda: 60.0, None)
    board.put(_state(2))  # the attack: the worker writes on after its notice
    board.raw[:] = 0xFF
    for name, value in sent.items():
        assert np.array_equal(chunk.state[name], value) and chunk.state[name].dtype == value.dtype
    # a model of the wrong shape is not written: it goes pickled, and the judge's load names it
    assert not board.put({**sent, "w": np.zeros((5, 3), np.float32)})
    assert not board.put({"w": sent["w"]})
    board.close()


def test_the_training_split_is_on_the_shelf_only_once_given_and_the_judge_keeps_its_own():
    x = np.arange(6 * 4, dtype=np.float32).reshape(6, 1, 2, 2) + 1
    y = np.arange(6, dtype=np.int64) + 1
    shelf = handover.Board.create({"x": x.shape, "y": y.shape}, {"x": x.dtype, "y": y.dtype})
    shelf.touch(write=True)
    ours, theirs = multiprocessing.Pipe()
    judge = _Judge(ours)
    judge.shelf = shelf
    assert not shelf.raw.any()  # before the clock the worker maps zeros
    judge.give(x, y, 10)
    assert theirs.recv() == ("data", handover.SHARED, handover.SHARED, 10)
    assert np.array_equal(shelf.views["x"], x) and np.array_equal(shelf.views["y"], y)
    shelf.raw[:] = 0xFF  # the worker writes its copy: the judge's split is its own
    assert x[0, 0, 0, 0] == 1 and y[0] == 1
    # a split that does not fit the layout exactly (shape or dtype) goes pickled
    for a, b in ((x[:5], y[:5]), (x.astype(np.float64), y)):
        judge.give(a, b, 10)
        got = theirs.recv()
        assert np.array_equal(got[1], a) and got[1].dtype == a.dtype
    shelf.close()


def test_a_notice_without_a_board_fails():
    ours, theirs = multiprocessing.Pipe()
    theirs.send(("trained", [0.5], handover.SHARED, False, ""))
    with pytest.raises(WorkerError, match="named a shared hand-over it was never given"):
        _Judge(ours).train(0, 0, 1, lambda: 60.0, None)


# Another process (as the worker is) writing the board all along, given its fd.
SCRIBBLER = """
import mmap, sys
import numpy as np
memory = mmap.mmap(int(sys.argv[1]), int(sys.argv[2]))
raw, i = np.frombuffer(memory, np.uint8), 0
print("writing", flush=True)
while True:
    raw[:] = i % 251
    i += 1
"""


def test_a_worker_writing_the_board_while_the_judge_copies_it_is_caught():
    big = {"w": (2048, 2048)}  # 16 MB: a copy long enough to overlap the writes surely
    board = handover.Board.create(big, {"w": np.float32})
    writer = subprocess.Popen([sys.executable, "-c", SCRIBBLER, str(board.fd), str(board.size)],
                              pass_fds=(board.fd,), stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "writing"
        end, caught = time.perf_counter() + 20.0, False
        while not caught and time.perf_counter() < end:
            try:
                board.take()
            except handover.Changed:
                caught = True
        assert caught
    finally:
        writer.kill()
        writer.wait(5)
        board.close()


def test_the_worker_cannot_resize_the_board_under_the_judges_mapping():
    board = handover.Board.create(SHAPES, DTYPES)
    for size in (0, board.size // 2, board.size * 2):  # a SIGBUS in the judge, or a grown file
        with pytest.raises(PermissionError):
            os.ftruncate(board.fd, size)
    board.close()


# On import (in the worker): a thread that finds the board and writes on it all along, so that
# the judge would evaluate what it wrote after the chunk was handed over.
SCRIBBLE = '''
import gc, threading, time
import numpy as np
from d500.training.optimizers import Optimizer


def scribble():
    while True:
        for obj in gc.get_objects():
            if type(obj).__name__ == "Board" and getattr(obj, "raw", None) is not None:
                while True:
                    obj.raw[:] = 0
                    time.sleep(0)  # (lets the worker train: a whole run stays short)
        time.sleep(0.001)


threading.Thread(target=scribble, daemon=True).start()


class Plain(Optimizer):
    name = "plain"

    def update(self, ops, params, grads, state, lr, t):
        ops.add_(params, grads, -lr)
'''


@pytest.mark.slow  # ~13 s: the scribbling thread slows the worker
def test_a_worker_scribbling_on_the_board_gains_nothing(home, tmp_path):
    """The attack through the entry's code: its run fails (a write caught mid-copy) or is judged
    on the zeros it wrote before the judge copied them (accuracy ~0.1), never better than its
    honest run (1 epoch: short of the target either way). The scribbler's gc.get_objects() can
    also hand it tuples CPython is still building, which then fails the worker's own next resize
    ("SystemError: ... bad argument to internal function", once in CI): the entry's code broke
    its own process, a failed run too; and the scribbling thread is one the run does not record,
    which the CPU meter may catch first."""
    result = entries.run(entries.entry(tmp_path, SCRIBBLE, "Plain"))
    assert result.status in ("failed", "missed"), result
    if result.status == "failed":
        assert result.error.startswith(("the worker wrote into the model it handed over",
                                        "SystemError: ",  # (its thread is one more than the
                                        "the worker's threads were runnable")), result.error


def test_a_run_hands_its_model_and_its_data_over_in_shared_memory_as_through_the_pipe(
        home, monkeypatch):
    from d500.training import submission, worker
    wl = workloads.load(MLP)
    wl.max_epochs = 2
    recipe = submission.load(SGD).recipe
    boards, shelves = [], []
    share, share_data = worker.Worker.share, worker.Worker.share_data

    def recorded(self, shapes, dtypes):
        share(self, shapes, dtypes)
        boards.append(self.board)

    def shelved(self, shapes, dtypes):
        share_data(self, shapes, dtypes)
        shelves.append(self.shelf)

    monkeypatch.setattr(worker.Worker, "share", recorded)
    monkeypatch.setattr(worker.Worker, "share_data", shelved)
    ledger = Ledger()
    shared = trainer.train(wl, recipe, "torch", 3, ledger=ledger, submission="s")
    # the model came back in shared memory, and the training split went there
    assert boards and boards[0] is not None and shelves and shelves[0] is not None
    monkeypatch.setattr(handover.Board, "create", classmethod(lambda cls, s, d: None))
    piped = trainer.train(wl, recipe, "torch", 3, ledger=ledger, submission="s")
    assert boards[1] is None and shelves[1] is None
    got = [[e["metrics"] for e in ledger.evaluations(r.run_id)] for r in (shared, piped)]
    assert got[0] == got[1] and len(got[0]) == 2
