"""d500.training.ahead: the worker readies the chunk it guesses comes next, but trains exactly the
batches the judge's message names, whatever it guessed; a real worker asked for chunks its
guesses miss trains as the loop before the split does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from d500.errors import ConfigError
from d500.training.ahead import Ahead
from d500.training.data.samplers import EpochSampler

ROOT = Path(__file__).resolve().parents[2]


def _split(size: int = 103):
    rng = np.random.default_rng(0)
    return rng.standard_normal((size, 4)).astype(np.float32), rng.integers(0, 10, size)


def _expected(x, y, epoch, first, count, batch, seed=5, drop_last=True):
    sampler = EpochSampler(len(y), batch, seed, drop_last)
    return [(x[i], y[i]) for i in list(sampler.epoch(epoch))[first:first + count]]


def _same(got, want):
    assert len(got) == len(want)
    for feeds, (wx, wy) in zip(got, want):
        np.testing.assert_array_equal(feeds["input"], wx)
        np.testing.assert_array_equal(feeds["labels"], wy)


@pytest.mark.parametrize("drop_last", [True, False])
def test_every_chunk_is_the_samplers_whatever_was_guessed(drop_last):
    x, y = _split()
    asked = [(0, 0, 3, 8), (0, 3, 10, 8), (1, 0, 4, 16), (1, 4, 3, 8), (3, 2, 5, 8),
             (3, 7, 99, 8), (4, 0, 7, 103 if drop_last else 200)]
    for guessed in ((0, 0, 8), (1, 0, 8), (0, 3, 16), None):  # right, and three ways wrong
        ahead = Ahead(x, y, 5, drop_last)
        if guessed is not None:
            ahead.guess(*guessed)
        for epoch, first, count, batch in asked:
            _same(list(ahead.chunk(epoch, first, count, batch)),
                  _expected(x, y, epoch, first, count, batch, drop_last=drop_last))
            ahead.after(epoch, first, count, batch)


def test_a_guess_is_used_only_for_the_very_chunk_it_readied():
    x, y = _split()
    ahead = Ahead(x, y, 5, True)
    ahead.guess(0, 2, 8)
    ready = ahead.fed[1]
    assert next(ahead.chunk(0, 2, 4, 8)) is ready  # the rows gathered while waiting
    for other in ((1, 2, 4, 8), (0, 3, 4, 8), (0, 2, 4, 16)):  # another epoch, step, batch
        ahead.guess(0, 2, 8)
        ready = ahead.fed[1]
        first = next(ahead.chunk(*other))
        assert first is not ready and ahead.fed is None  # spent by the next chunk, unused
        _same([first], _expected(x, y, other[0], other[1], 1, other[3]))


def test_after_guesses_the_rest_of_the_epoch_then_the_next():
    x, y = _split(100)  # 12 batches of 8 an epoch, drop_last
    ahead = Ahead(x, y, 5, True)
    ahead.after(0, 0, 5, 8)
    assert ahead.fed[0] == (0, 5, 8)
    ahead.after(0, 5, 7, 8)
    assert ahead.fed[0] == (1, 0, 8)
    ahead.after(2, 0, 50, 8)  # a chunk cut short by the epoch's end
    assert ahead.fed[0] == (3, 0, 8)


def test_a_batch_the_sampler_refuses_is_refused_as_asked_never_as_guessed():
    x, y = _split(20)
    ahead = Ahead(x, y, 5, True)
    ahead.guess(0, 0, 64)  # more than the split: nothing readied, nothing raised
    assert ahead.fed is None
    with pytest.raises(ConfigError, match="exceeds the 20 training samples"):
        list(ahead.chunk(0, 0, 1, 64))


def test_only_the_last_two_epochs_are_kept():
    x, y = _split()
    ahead = Ahead(x, y, 5, True)
    for epoch in range(6):
        ahead.batches(epoch, 8)
        ahead.batches(epoch, 16)
    assert {e for e, _ in ahead.made} == {4, 5}


@pytest.mark.slow  # (a real worker started, ~25 s at load 15)
def test_a_worker_asked_for_chunks_its_guesses_miss_trains_as_the_loop_before_the_split():
    """A real worker (d500.training.worker.main) asked for a chunk it guessed, one at another
    batch, one of a skipped epoch, then the rest of it: each chunk's losses are those of the
    same trainer stepped in this process over the sampler's batches (the benchmark's
    in-process loop, benchmarks/isolation.py). Its board holds the model as built, written
    there once before the clock (its pages faulted in), until a chunk hands the model over."""
    from dataclasses import replace

    from d500.training import submission, trainer, workloads
    from d500.training.data import dataset
    from d500.training.worker import Job, Worker, _build, _state
    wl = workloads.load(ROOT / "levels" / "2-training" / "digits-mlp.yaml")
    recipe = submission.load(ROOT / "submissions" / "sgd-momentum").recipe
    import torch
    # torch alone at 1 thread here (threads.configure would also set a TensorFlow that another
    # test ran in this process, which cannot change); the worker configures its own, as d500 does
    torch.set_num_threads(1)
    backend_cls, model = trainer.ready(wl, recipe, "torch", None, 0)
    job = Job(model.SerializeToString(), "torch", recipe, 3, {"count": 1, "set_by": "--threads"},
              wl.drop_last)
    train = dataset.parts(wl.dataset, None)[0].train
    total, asked = 400, [(0, 0, 4, 32), (0, 4, 3, 16), (2, 5, 3, 16), (2, 8, 2, 16)]
    here = _build(replace(job, threads=None), lambda: None)
    built = {k: v.copy() for k, v in _state(here).items()}
    lr_at, step, want = recipe.schedule(total), 0, []
    for epoch, first, count, batch in asked:
        losses = []
        for x, y in _expected(train.x, train.y, epoch, first, count, batch, 3, wl.drop_last):
            losses.append(here.step({"input": x, "labels": y}, lr_at(step)))
            step += 1
        want.append(losses)
    worker = Worker(job)
    try:
        worker.ready()
        judge = trainer.Judge(backend_cls, model)
        worker.share(judge.shapes, judge.dtypes)
        worker.give(train.x, train.y, total)
        got = [worker.train(*a[:3], lambda: 60.0, None, want=False, batch=a[3]).losses
               for a in asked]
        if worker.board is not None:  # (a system without memfd pickles every hand-over)
            board = worker.board.take()
            assert set(board) == set(built)
            for name, value in built.items():
                np.testing.assert_array_equal(board[name], value)
        last = worker.train(2, 10, 1, lambda: 60.0, None, want=True, batch=16)
    finally:
        worker.close()
    assert [len(c) for c in got] == [a[2] for a in asked]
    assert sum(got, []) == pytest.approx(sum(want, []), rel=1e-5)
    assert any(not np.array_equal(last.state[n], v) for n, v in built.items())


def test_a_kept_batch_cut_in_the_worker_fails_the_chunk():
    """Code in the worker (the entry's) that cuts the batches kept between chunks to train at a
    batch of its own: the chunk stops at the first such batch, and the run fails on its line."""
    from d500.training.ahead import Changed
    x, y = _split()
    ahead = Ahead(x, y, 5, True)
    ahead.after(0, 0, 12, 8)  # epoch 1's batches kept, its first rows gathered
    ahead.made = {k: [b[:2] for b in v] for k, v in ahead.made.items()}
    ahead.fed = (ahead.fed[0], {"input": x[:2], "labels": y[:2]})
    with pytest.raises(Changed, match="step 1 of epoch 2 would train 2 samples, not the 8"):
        list(ahead.chunk(1, 0, 5, 8))
    ahead = Ahead(x, y, 5, False)  # an epoch's last batch is shorter: that is the sampler's
    assert [len(f["labels"]) for f in ahead.chunk(0, 11, 5, 9)] == [4]
