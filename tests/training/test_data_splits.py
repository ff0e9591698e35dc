"""Fixed splits, the seeded permutation under them, and the per-epoch samplers (plain and
partitioned over ranks)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from d500.errors import ConfigError
from d500.training import data
from d500.training.data import shuffle
from d500.training.data.dataset import Dataset

MASK = (1 << 64) - 1


def splitmix64_reference(start: int, n: int) -> list[int]:
    """SplitMix64 (Steele, Lea, Flood 2014) in Python integers, for comparison."""
    out, state = [], start
    for _ in range(n):
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        out.append(z ^ (z >> 31))
    return out


def test_permutation_is_splitmix64_of_a_blake2b_start_and_pinned():
    start = int.from_bytes(hashlib.blake2b(b'["split",0]', digest_size=8).digest(), "little")
    assert int(shuffle.start("split", 0)) == start
    assert shuffle.splitmix64(np.uint64(start), 50).tolist() == splitmix64_reference(start, 50)
    # Pinned: a change here changes every recorded split and data order.
    assert shuffle.permutation(12, "split", 0).tolist() == [8, 10, 11, 9, 1, 4, 2, 6, 7, 3, 5, 0]
    assert shuffle.permutation(12, "epoch", 7, 3).tolist() == [9, 5, 11, 4, 6, 1, 10, 0, 3, 8,
                                                               7, 2]


def fake(n: int, test: int | None = None, channels: int = 1) -> Dataset:
    rng = np.random.default_rng(n)
    x = rng.integers(0, 256, (n, channels, 4, 4), np.uint8)
    tx = rng.integers(0, 256, (test, channels, 4, 4), np.uint8) if test else None
    return Dataset("fake", x, np.arange(n) % 10, 10, "scale", 255.0, tx,
                   np.arange(test) % 10 if test else None)


def test_digits_split_sizes_disjoint_and_normalised():
    ds = data.load("digits")
    parts = data.split(ds, data.SplitSpec(train=1200, validation=297, test=300, seed=0))
    assert (len(parts.train), len(parts.validation), len(parts.test)) == (1200, 297, 300)
    every = np.concatenate([parts.train.indices, parts.validation.indices, parts.test.indices])
    assert len(np.unique(every)) == 1797  # disjoint, and here they use every sample
    for part in (parts.train, parts.validation, parts.test):
        assert part.x.dtype == np.float32 and part.x.shape[1:] == (1, 8, 8)
        np.testing.assert_array_equal(part.x, ds.x[part.indices] / np.float32(16))
        np.testing.assert_array_equal(part.y, ds.y[part.indices])
    assert parts.normalization.describe() == {"kind": "scale", "mean": [0.0], "std": [16.0]}


def test_split_depends_only_on_dataset_sizes_and_seed():
    ds = data.load("digits")
    spec = data.SplitSpec(train=1000, validation=300, test=300, seed=11)
    first = data.split(ds, spec)
    np.random.seed(123)  # global NumPy state plays no part
    np.random.default_rng(5).random(10)
    again = data.split(data.load("digits"), spec)
    assert first.fingerprint() == again.fingerprint()
    assert data.split(ds, data.SplitSpec(1000, 300, 300, seed=12)).fingerprint() \
        != first.fingerprint()
    # Growing the training part keeps validation and test as they were.
    bigger = data.split(ds, data.SplitSpec(train=1197, validation=300, test=300, seed=11))
    np.testing.assert_array_equal(bigger.validation.indices, first.validation.indices)
    np.testing.assert_array_equal(bigger.test.indices, first.test.indices)
    assert set(first.train.indices) < set(bigger.train.indices)


def test_split_is_the_same_in_another_process():
    code = ("from d500.training import data; print(data.split(data.load('digits'), "
            "data.SplitSpec(1000, 300, 300, seed=11)).fingerprint())")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120, check=True).stdout.strip()
    spec = data.SplitSpec(1000, 300, 300, seed=11)
    assert out == data.split(data.load("digits"), spec).fingerprint()


def test_official_test_set_gives_the_test_part():
    ds = fake(100, test=40)
    parts = data.split(ds, data.SplitSpec(train=70, validation=30, test=25, seed=1))
    assert len(parts.test) == 25 and parts.test.indices.max() < 40
    np.testing.assert_array_equal(parts.test.x, ds.test_x[parts.test.indices] / np.float32(255))
    np.testing.assert_array_equal(parts.test.y, ds.test_y[parts.test.indices])
    assert not set(parts.train.indices) & set(parts.validation.indices)
    full = data.split(ds, data.SplitSpec(train=70, validation=30, test=40, seed=1))
    assert full.test.indices.tolist() == list(range(40))


def test_sizes_that_do_not_fit_are_config_errors():
    with pytest.raises(ConfigError) as err:
        data.split(data.load("digits"), data.SplitSpec(1500, 200, 200, 0))
    assert str(err.value) == ("split: train 1500 + validation 200 + test 200 = 1900 exceeds "
                              "the 1797 samples of digits")
    with pytest.raises(ConfigError, match="split.test: 41 exceeds the 40 samples"):
        data.split(fake(100, test=40), data.SplitSpec(50, 10, 41, 0))
    with pytest.raises(ConfigError, match="train 90 \\+ validation 11 = 101 exceeds the 100"):
        data.split(fake(100, test=40), data.SplitSpec(90, 11, 10, 0))
    for bad in [(0, 1, 1, 0), (1, 1, 1, -1), (1, True, 1, 0), (1.5, 1, 1, 0)]:
        with pytest.raises(ConfigError, match="split\\."):
            data.SplitSpec(*bad)


def test_standardisation_uses_the_training_part_only():
    ds = fake(60, test=20, channels=3)
    ds.normalization = "standardize"
    parts = data.split(ds, data.SplitSpec(train=40, validation=20, test=20, seed=3))
    raw = ds.x[parts.train.indices].astype(np.float64)
    mean, std = raw.mean(axis=(0, 2, 3)), raw.std(axis=(0, 2, 3))
    np.testing.assert_allclose(parts.normalization.mean, mean, rtol=1e-12)
    np.testing.assert_allclose(parts.normalization.std, std, rtol=1e-12)
    np.testing.assert_allclose(parts.train.x.mean(axis=(0, 2, 3)), 0, atol=1e-5)
    np.testing.assert_allclose(parts.train.x.std(axis=(0, 2, 3)), 1, atol=1e-5)
    expected = (ds.test_x[parts.test.indices] - mean[None, :, None, None]) \
        / std[None, :, None, None]
    np.testing.assert_allclose(parts.test.x, expected, rtol=1e-5, atol=1e-5)
    json.dumps(parts.normalization.describe())


# ------------------------------------------------------------------ samplers

def test_epoch_sampler_shuffles_per_epoch_and_drops_last():
    sampler = data.EpochSampler(10, batch_size=4, seed=2)
    batches = list(sampler.epoch(0))
    assert [len(b) for b in batches] == [4, 4, 2] and len(sampler) == 3
    assert sorted(np.concatenate(batches).tolist()) == list(range(10))
    again = [b.tolist() for b in data.EpochSampler(10, 4, seed=2).epoch(0)]
    assert again == [b.tolist() for b in batches]
    assert sampler.order(1).tolist() != sampler.order(0).tolist()
    assert data.EpochSampler(10, 4, seed=3).order(0).tolist() != sampler.order(0).tolist()
    dropped = data.EpochSampler(10, 4, seed=2, drop_last=True)
    assert [b.tolist() for b in dropped.epoch(0)] == [b.tolist() for b in batches[:2]]
    assert len(dropped) == 2 and dropped.samples_per_epoch == 8
    plain = data.EpochSampler(5, 2, seed=0, shuffle=False)
    assert [b.tolist() for b in plain.epoch(4)] == [[0, 1], [2, 3], [4]]


def test_sampler_errors():
    with pytest.raises(ConfigError, match="batch_size: 20 exceeds the 10 training samples"):
        data.EpochSampler(10, 20, seed=0, drop_last=True)
    with pytest.raises(ConfigError, match="batch_size: expected an integer >= 1"):
        data.EpochSampler(10, 0, seed=0)
    with pytest.raises(ConfigError, match="rank: 2 is not below the world size 2"):
        data.PartitionedSampler(10, 4, seed=0, rank=2, world=2)
    with pytest.raises(ConfigError, match="global batch 2 is smaller than the 3 ranks"):
        data.PartitionedSampler(10, 2, seed=0, rank=0, world=3)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_partitioned_sampler_shares_each_global_batch(world, drop_last):
    size, batch, seed = 103, 12, 9
    single = data.EpochSampler(size, batch, seed, drop_last)
    ranks = [data.PartitionedSampler(size, batch, seed, r, world, drop_last)
             for r in range(world)]
    for epoch in (0, 1):
        steps = [list(r.epoch(epoch)) for r in ranks]
        assert {len(s) for s in steps} == {len(single)}  # every rank takes the same steps
        seen = []
        for step, expected in enumerate(single.epoch(epoch)):
            shares = [s[step] for s in steps]
            assert max(map(len, shares)) - min(map(len, shares)) <= 1
            union = np.concatenate(shares)
            assert union.tolist() == expected.tolist()  # disjoint, and the global batch
            seen.extend(union.tolist())
        order = single.order(epoch).tolist()
        assert seen == (order[:len(single) * batch] if drop_last else order)
        assert len(set(seen)) == len(seen)
