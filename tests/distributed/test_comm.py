"""The communicator in one process: the 1-rank communicator without MPI (every collective the
identity, no bytes), zero-copy views of torch tensors, refusals, and the byte-count formulas the
MPI checks (test_comm_mpi.py) hold the ranks to."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from d500.distributed import launch
from d500.distributed.comm import (
    CommError,
    Communicator,
    as_array,
    chain_counts,
    chunk_bounds,
    gather_counts,
    ring_counts,
)
from d500.errors import D500Error
from tests.distributed.test_launch import plain_process


@pytest.fixture
def single(monkeypatch) -> Communicator:
    for name in launch.LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return Communicator.for_world()


def test_without_a_launcher_the_world_is_one_rank(single):
    assert (single.mpi, single.rank, single.size, single.left, single.right) == (None, 0, 1, 0, 0)


def test_one_rank_collectives_are_the_identity_and_count_no_bytes(single):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    before = x.copy()
    for op in ("sum", "average"):
        assert single.allreduce(x, op=op) is x and np.array_equal(x, before)
        assert single.ring_allreduce(x, op=op) is x and np.array_equal(x, before)
    assert single.broadcast(x) is x and np.array_equal(x, before)
    rows = single.allgather(x)
    assert rows.shape == (1, 3, 4) and np.array_equal(rows[0], x)
    blocks = single.allgatherv(x)
    assert len(blocks) == 1 and np.array_equal(blocks[0], x.reshape(-1))
    left, right = single.neighbour_exchange(x)
    assert np.array_equal(left, x) and np.array_equal(right, x) and left is not x
    single.barrier()
    assert single.bytes_sent == single.bytes_received == 0
    assert {n: t.calls for n, t in single.traffic.items()} == {
        "allreduce": 2, "ring_allreduce": 2, "broadcast": 1, "allgather": 1, "allgatherv": 1,
        "neighbour_exchange": 1, "barrier": 1}
    single.reset()
    assert single.traffic == {} and single.seconds == 0


def test_one_rank_nonblocking_collectives_are_the_identity(single):
    x = np.arange(6, dtype=np.float32)
    assert np.array_equal(single.iallgatherv(x, [6]).wait()[0], x)
    assert np.array_equal(single.ireduce_scatter(x, [6], op="average").wait(), x)
    assert single.bytes_sent == 0
    assert {n: t.calls for n, t in single.traffic.items()} == {"allgatherv": 1,
                                                               "reduce_scatter": 1}
    with pytest.raises(CommError, match="do not split 6 elements"):
        single.ireduce_scatter(x, [5])


def test_one_rank_needs_no_mpi4py():
    code = ("import sys, numpy as np\nfrom d500.distributed.comm import Communicator\n"
            "c = Communicator.for_world()\nx = np.ones(5)\nc.allreduce(x, op='average')\n"
            "c.ring_allreduce(x)\nc.broadcast(x)\nc.allgatherv(x)\nc.neighbour_exchange(x)\n"
            "c.barrier()\nassert c.size == 1 and x.tolist() == [1.0] * 5\n"
            "print('mpi4py' in sys.modules)")
    assert plain_process(code) == "False"


def test_torch_tensors_are_viewed_not_copied():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    a = as_array(t)
    assert a.ctypes.data == t.data_ptr() and a.shape == (2, 3) and a.dtype == np.float32
    a[0, 0] = 42
    assert t[0, 0].item() == 42
    p = torch.nn.Parameter(torch.ones(4))  # requires grad: viewed through detach()
    assert as_array(p).ctypes.data == p.data_ptr()
    c = Communicator.single()
    g = torch.ones(4, dtype=torch.float64)
    assert c.allreduce(g, op="average") is g and g.tolist() == [1.0] * 4


@pytest.mark.parametrize("bad, message", [
    ([1.0, 2.0], "NumPy arrays or torch CPU tensors, got list"),
    (torch.ones(3, dtype=torch.bfloat16), "has no NumPy view"),
])
def test_what_the_communicator_refuses(bad, message):
    with pytest.raises(CommError, match=message):
        Communicator.single().allreduce(bad)


def test_in_place_needs_a_writable_array_and_an_average_needs_floats():
    c = Communicator.single()
    frozen = np.ones(3)
    frozen.flags.writeable = False
    with pytest.raises(CommError, match="read-only"):
        c.allreduce(frozen)
    with pytest.raises(CommError, match="average of int32"):
        c.ring_allreduce(np.ones(3, dtype=np.int32), op="average")
    with pytest.raises(CommError, match="unknown reduction 'max'"):
        c.allreduce(np.ones(3), op="max")
    assert issubclass(CommError, D500Error)


def test_allgather_out_must_fit():
    c = Communicator.single()
    with pytest.raises(CommError, match=r"out must be float32 of shape \(1, 3\)"):
        c.allgather(np.ones(3, dtype=np.float32), out=np.empty((2, 3), dtype=np.float32))
    with pytest.raises(CommError, match="outputs must be float64 of shape"):
        c.neighbour_exchange(np.ones(3), out_right=np.empty(3, dtype=np.float32))


@pytest.mark.parametrize("size", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("length", [0, 1, 2, 5, 6, 1000, 1001])
def test_ring_counts(size, length):
    b = chunk_bounds(length, size)
    assert [b[k + 1] - b[k] for k in range(size)] == [
        len(c) for c in np.array_split(np.arange(length), size)]
    counts = [ring_counts(length, size, r) for r in range(size)]
    # summed over ranks, 2(N-1) buffers each way; per rank 2(N-1)/N of one, within 2 elements
    assert sum(s for s, _ in counts) == sum(r for _, r in counts) == 2 * (size - 1) * length
    for sent, received in counts:
        for value in (sent, received):
            assert abs(value - 2 * (size - 1) / size * length) < 2
            if length % size == 0:
                assert value == 2 * (size - 1) * length // size


def test_chain_and_gather_counts():
    assert [chain_counts(100, 4, r, root=2) for r in range(4)] == [(100, 100), (0, 100),
                                                                   (100, 0), (100, 100)]
    assert chain_counts(100, 1, 0, 0) == (0, 0)
    blocks = [0, 8, 16, 24]
    assert [gather_counts(blocks, r) for r in range(4)] == [(40, 48), (32, 40), (24, 32),
                                                            (48, 24)]
    assert gather_counts([8], 0) == (0, 0)
