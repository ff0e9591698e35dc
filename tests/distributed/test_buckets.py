"""Tensor fusion in one process: the bucket layout (one dtype per bucket, at most bucket_bytes,
an oversized array alone), pack/unpack round trips into NumPy arrays and torch param.grad in place
(strided arrays included), a layout kept across steps, and arrays that no longer fit it. The
reduction over real ranks is in mpi_comm_checks.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from d500.distributed.buckets import DEFAULT_BUCKET_BYTES, Buckets
from d500.distributed.comm import CommError, Communicator


def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"w1": rng.standard_normal((10, 10)).astype(np.float32),  # 400 bytes
            "b1": rng.standard_normal(10).astype(np.float32),  # 40
            "steps": np.arange(3, dtype=np.int64),  # 24, another dtype
            "w2": rng.standard_normal((5, 10)).astype(np.float32),  # 200
            "b2": rng.standard_normal(5).astype(np.float32)}  # 20


def test_layout_one_dtype_per_bucket_within_the_byte_limit():
    b = Buckets(arrays(), bucket_bytes=256)
    layout = [(str(k.dtype), [s.key for s in k.slots], k.nbytes) for k in b.buckets]
    assert layout == [("float32", ["w1"], 400),  # larger than a bucket: alone
                      ("float32", ["b1", "w2"], 240),
                      ("int64", ["steps"], 24),
                      ("float32", ["b2"], 20)]
    assert b.nbytes == 684 and len(b) == 4
    assert [s.offset for s in b.buckets[1].slots] == [0, 10]
    whole = Buckets(arrays())
    assert whole.bucket_bytes == DEFAULT_BUCKET_BYTES == 25 * 2**20
    assert [[s.key for s in k.slots] for k in whole.buckets] == [["w1", "b1", "w2", "b2"],
                                                                ["steps"]]


def test_pack_apply_unpack_round_trip():
    grads = arrays()
    before = {k: v.copy() for k, v in grads.items()}
    b = Buckets(grads, bucket_bytes=256)
    packed = b.pack(grads)
    assert np.shares_memory(packed[0], grads["w1"])  # a single contiguous array: no copy
    assert not np.shares_memory(packed[1], grads["b1"])
    assert np.array_equal(packed[1], np.concatenate([before["b1"], before["w2"].ravel()]))
    b.apply(grads, lambda buf: np.multiply(buf, 3, out=buf))
    for k, v in grads.items():
        assert np.array_equal(v, before[k] * 3), k


def test_results_land_in_torch_grads_in_place_strided_ones_too():
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Linear(6, 2))
    for p in model.parameters():
        p.grad = torch.full_like(p, 2.0)
    grads = {n: p.grad for n, p in model.named_parameters()}
    grads["0.weight"] = model[0].weight.grad.t()  # a transposed (strided) view of the grad
    pointers = {n: g.data_ptr() for n, g in grads.items()}
    b = Buckets(grads, bucket_bytes=64)  # every array alone or nearly
    for step in range(2):
        b.apply(grads, lambda buf: np.add(buf, 1, out=buf))
        for n, p in model.named_parameters():
            assert torch.all(p.grad == 3.0 + step), n
        assert {n: g.data_ptr() for n, g in grads.items()} == pointers


def test_one_rank_allreduce_through_buckets_is_the_identity():
    c = Communicator.single()
    grads = arrays()
    before = {k: v.copy() for k, v in grads.items()}
    b = Buckets(grads, bucket_bytes=256)
    b.allreduce(grads, c, op="sum")
    b.allreduce(grads, c, op="sum", ring=True)
    assert all(np.array_equal(grads[k], before[k]) for k in grads)
    assert c.traffic["allreduce"].calls == c.traffic["ring_allreduce"].calls == 4
    assert c.bytes_sent == 0


def test_a_list_of_arrays_is_keyed_by_position():
    grads = list(arrays().values())
    b = Buckets(grads)
    b.apply(grads, lambda buf: np.negative(buf, out=buf))
    assert np.array_equal(grads[2], -np.arange(3))


def test_arrays_that_no_longer_fit_the_layout():
    b = Buckets(arrays())
    changed = arrays()
    changed["w2"] = np.zeros((10, 5), dtype=np.float32)
    with pytest.raises(CommError, match=r"array 'w2' is float32 \(10, 5\), the bucket layout "
                                        r"has float32 \(5, 10\)"):
        b.pack(changed)
    missing = arrays()
    del missing["b2"]
    with pytest.raises(CommError, match="holds 5 arrays, got 4"):
        b.pack(missing)
    renamed = arrays()
    renamed["b3"] = renamed.pop("b2")
    with pytest.raises(CommError, match="no array 'b2'"):
        b.pack(renamed)
    with pytest.raises(CommError, match="unpack before pack"):
        Buckets(arrays()).unpack(arrays())


@pytest.mark.parametrize("bad", [0, -5, 2.5, True, "25MB"])
def test_bucket_bytes_must_be_a_positive_whole_number(bad):
    with pytest.raises(CommError, match="bucket_bytes must be a positive whole number"):
        Buckets(arrays(), bucket_bytes=bad)
