"""The communicator's checks that need real MPI ranks, run by test_comm_mpi.py as
`mpiexec -n N python mpi_comm_checks.py [CHECK ...]`: every rank runs every check; one JSON
line per check passed, and the first failure ends the job (see main)."""

from __future__ import annotations

import json
import sys
import threading
import traceback
from collections.abc import Callable

import numpy as np

from d500.distributed.buckets import Buckets
from d500.distributed.comm import (
    CommError,
    Communicator,
    as_array,
    chain_counts,
    chunk_bounds,
    gather_counts,
    ring_counts,
)
from d500.distributed.faults import wait_until_read

CHECKS: dict[str, Callable[[Communicator], None]] = {}
LIMIT = 60.0  # seconds a check may take


def check(fn: Callable[[Communicator], None]) -> Callable[[Communicator], None]:
    CHECKS[fn.__name__] = fn
    return fn


def lengths(n: int) -> list[int]:
    """1, N-1, a multiple of N and two non-multiples (one shorter than N chunks of 2)."""
    return [1, n - 1, 1000, 1000 * n + n // 2 + 1, n + 1]


def data(rank: int, length: int, dtype: type, seed: int = 0, integer: bool = False
         ) -> np.ndarray:
    """Rank `rank`'s input: any rank can make any other rank's, to compute sums locally."""
    rng = np.random.default_rng([seed, rank, length])
    if integer:
        return rng.integers(-50, 50, size=length).astype(dtype)
    return rng.standard_normal(length).astype(dtype)


def total(c: Communicator, length: int, dtype: type, **kw) -> np.ndarray:
    """The sum over ranks, in float64, computed locally."""
    return sum(data(r, length, dtype, **kw).astype(np.float64) for r in range(c.size))


def same_everywhere(c: Communicator, a: np.ndarray) -> bool:
    rows = c.allgather(np.ascontiguousarray(a))
    return all(np.array_equal(rows[0], row) for row in rows)


@check
def ring_equals_mpi_allreduce(c: Communicator) -> None:
    for dtype, rtol in ((np.float32, 1e-5), (np.float64, 1e-12)):
        for length in lengths(c.size):
            ring, mpi = data(c.rank, length, dtype), data(c.rank, length, dtype)
            assert c.ring_allreduce(ring) is ring
            c.allreduce(mpi)
            expected = total(c, length, dtype)
            np.testing.assert_allclose(ring, expected, rtol=rtol, atol=rtol)
            np.testing.assert_allclose(ring, mpi, rtol=rtol, atol=rtol)
            assert ring.dtype == dtype and same_everywhere(c, ring), (dtype, length)
            ring = data(c.rank, length, dtype, integer=True)  # exact sums: bitwise equal
            mpi = ring.copy()
            c.ring_allreduce(ring)
            c.allreduce(mpi)
            assert np.array_equal(ring, mpi), (dtype, length)
            assert np.array_equal(ring, total(c, length, dtype, integer=True))


@check
def ring_takes_float16_and_integers_and_averages(c: Communicator) -> None:
    for dtype in (np.float16, np.int32, np.int64):
        a = data(c.rank, 37, dtype, integer=True)
        b = a.copy()
        c.ring_allreduce(a)
        c.allreduce(b)
        assert a.dtype == dtype and np.array_equal(a, b), dtype
        assert np.array_equal(a, total(c, 37, dtype, integer=True)), dtype
    for length in lengths(c.size):
        ring, mpi = data(c.rank, length, np.float64), data(c.rank, length, np.float64)
        c.ring_allreduce(ring, op="average")
        c.allreduce(mpi, op="average")
        np.testing.assert_allclose(ring, total(c, length, np.float64) / c.size, rtol=1e-12)
        np.testing.assert_allclose(mpi, ring, rtol=1e-12)
    grid = data(c.rank, 60, np.float32).reshape(6, 10)
    strided = grid[:, ::3]  # not contiguous: reduced through a copy, written back
    expected = total(c, 60, np.float32).reshape(6, 10)[:, ::3]
    c.ring_allreduce(strided)
    np.testing.assert_allclose(grid[:, ::3], expected, rtol=1e-5, atol=1e-5)


@check
def ring_bytes_are_2_n_minus_1_over_n_of_the_buffer(c: Communicator) -> None:
    n = c.size
    for dtype in (np.float32, np.float64):
        item = np.dtype(dtype).itemsize
        for length in lengths(n):
            c.reset()
            c.ring_allreduce(data(c.rank, length, dtype))
            c.allreduce(data(c.rank, length, dtype))
            ring, mpi = c.traffic["ring_allreduce"], c.traffic["allreduce"]
            nbytes = length * item
            # exactly what was passed to Sendrecv: every chunk but two, each way
            b = chunk_bounds(length, n)
            chunk = [b[k + 1] - b[k] for k in range(n)]
            r = c.rank
            assert ring.sent == item * (2 * length - chunk[(r + 1) % n] - chunk[(r + 2) % n])
            assert ring.received == item * (2 * length - chunk[r] - chunk[(r + 1) % n])
            assert (ring.sent, ring.received) == tuple(item * k for k in ring_counts(length, n, r))
            ideal = 2 * (n - 1) / n * nbytes
            if length % n == 0:
                assert ring.sent == ring.received == ideal, (length, ring)
            else:  # chunks differ by one element: within two elements of the ideal
                assert abs(ring.sent - ideal) < 2 * item and abs(ring.received - ideal) < 2 * item
            sums = c.allgather(np.array([ring.sent, ring.received], dtype=np.int64)).sum(axis=0)
            assert sums.tolist() == [2 * (n - 1) * nbytes] * 2, (length, sums)
            # MPI's Allreduce is counted as the same ring would send it
            assert (mpi.sent, mpi.received) == (ring.sent, ring.received)
            assert ring.calls == mpi.calls == 1 and ring.seconds > 0 and mpi.seconds > 0


@check
def torch_tensors_are_reduced_in_place_without_a_copy(c: Communicator) -> None:
    import torch
    t = torch.from_numpy(data(c.rank, 1001, np.float32))
    pointer = t.data_ptr()
    assert as_array(t).ctypes.data == pointer  # the view shares the tensor's memory
    assert c.ring_allreduce(t) is t and t.data_ptr() == pointer
    np.testing.assert_allclose(t.numpy(), total(c, 1001, np.float32), rtol=1e-5, atol=1e-5)
    p = torch.nn.Parameter(torch.zeros(3, 4))
    p.grad = torch.from_numpy(data(c.rank, 12, np.float32).reshape(3, 4))
    pointer = p.grad.data_ptr()
    c.allreduce(p.grad, op="average")
    assert p.grad.data_ptr() == pointer
    np.testing.assert_allclose(p.grad.numpy().reshape(-1), total(c, 12, np.float32) / c.size,
                               rtol=1e-5, atol=1e-6)


@check
def broadcast_from_any_root(c: Communicator) -> None:
    root = c.size - 1
    for dtype in (np.float32, np.int64):
        a = data(c.rank, 999, dtype, integer=True)
        c.reset()
        assert c.broadcast(a, root=root) is a
        assert np.array_equal(a, data(root, 999, dtype, integer=True))
        t = c.traffic["broadcast"]
        assert (t.sent, t.received) == chain_counts(a.nbytes, c.size, c.rank, root)
        if c.rank == root:
            assert t.received == 0 and t.sent == a.nbytes
        sums = c.allgather(np.array([t.sent, t.received], dtype=np.int64)).sum(axis=0)
        assert sums.tolist() == [(c.size - 1) * a.nbytes] * 2


@check
def allgather_equal_blocks(c: Communicator) -> None:
    import torch
    a = data(c.rank, 24, np.float32).reshape(4, 6)
    c.reset()
    rows = c.allgather(a)
    assert rows.shape == (c.size, 4, 6)
    for r in range(c.size):
        assert np.array_equal(rows[r], data(r, 24, np.float32).reshape(4, 6))
    t = c.traffic["allgather"]
    assert t.sent == t.received == (c.size - 1) * a.nbytes
    out = torch.empty(c.size, 4, 6)
    pointer = out.data_ptr()
    assert c.allgather(torch.from_numpy(a), out=out) is out and out.data_ptr() == pointer
    assert np.array_equal(out.numpy(), rows)


@check
def allgatherv_varying_lengths(c: Communicator) -> None:
    counts = [3 * r for r in range(c.size)]  # rank 0 contributes nothing
    mine = data(c.rank, counts[c.rank], np.float64)
    for given in (None, counts):
        c.reset()
        blocks = c.allgatherv(mine, counts=given)
        assert [b.size for b in blocks] == counts
        for r, b in enumerate(blocks):
            assert np.array_equal(b, data(r, counts[r], np.float64))
        t = c.traffic["allgatherv"]
        sent, received = gather_counts([8 * k for k in counts], c.rank)
        extra = 0 if given else 8 * (c.size - 1)  # the lengths, allgathered first
        assert (t.sent, t.received) == (sent + extra, received + extra), (given, t)
    wrong = [*counts[1:], 1]  # every rank refuses before communicating
    try:
        c.allgatherv(mine, counts=wrong)
        raise AssertionError("allgatherv took counts that do not fit")
    except CommError as err:
        assert "do not give rank" in str(err)


@check
def nonblocking_gather_and_reduce_scatter_equal_the_blocking_ones(c: Communicator) -> None:
    """iallgatherv and ireduce_scatter, both under way at once while this rank computes, give
    what allgatherv and reduce_scatter give and count the same bytes under the same names."""
    counts = [3 * r + 1 for r in range(c.size)]
    mine = data(c.rank, counts[c.rank], np.float32)
    whole = data(c.rank, sum(counts), np.float32, seed=1)
    c.reset()
    want_blocks = c.allgatherv(mine, counts)
    want_mine = c.reduce_scatter(whole, counts, op="average")
    blocking = {n: (t.sent, t.received, t.calls) for n, t in c.traffic.items()}
    c.reset()
    gathering = c.iallgatherv(mine, counts)
    scattering = c.ireduce_scatter(whole, counts, op="average")
    busy = np.linalg.norm(np.ones((64, 64)) @ np.ones((64, 64)))  # compute meanwhile
    got = scattering.wait()
    blocks = gathering.wait()
    assert busy > 0 and scattering.wait() is got  # a second wait returns the same result
    assert all(np.array_equal(b, w) for b, w in zip(blocks, want_blocks))
    assert np.array_equal(got, want_mine), (got, want_mine)
    assert {n: (t.sent, t.received, t.calls) for n, t in c.traffic.items()} == blocking


@check
def neighbour_exchange_with_both_ring_neighbours(c: Communicator) -> None:
    import torch
    a = data(c.rank, 50, np.float32).reshape(5, 10)
    c.reset()
    from_left, from_right = c.neighbour_exchange(a)
    assert np.array_equal(from_left, data((c.rank - 1) % c.size, 50, np.float32).reshape(5, 10))
    assert np.array_equal(from_right, data((c.rank + 1) % c.size, 50, np.float32).reshape(5, 10))
    if c.size == 2:  # both neighbours are the other rank
        assert np.array_equal(from_left, from_right)
    t = c.traffic["neighbour_exchange"]
    assert t.sent == t.received == 2 * a.nbytes and t.calls == 1
    left, right = torch.empty(5, 10), torch.empty(5, 10)
    got = c.neighbour_exchange(torch.from_numpy(a), out_left=left, out_right=right)
    assert got[0] is left and got[1] is right
    assert np.array_equal(left.numpy(), from_left) and np.array_equal(right.numpy(), from_right)


@check
def buckets_reduce_into_param_grads_in_place(c: Communicator) -> None:
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(30, 40), torch.nn.ReLU(),
                                torch.nn.Linear(40, 20), torch.nn.Linear(20, 3))
    for step in range(3):
        for i, (name, p) in enumerate(model.named_parameters()):
            values = data(c.rank, p.numel(), np.float32, seed=10 * step + i)
            p.grad = torch.from_numpy(values.reshape(p.shape).copy())
        grads = {name: p.grad for name, p in model.named_parameters()}
        pointers = {name: g.data_ptr() for name, g in grads.items()}
        if step == 0:  # weights 4800, 3200, 240 bytes; biases 160, 80, 12: the first weight
            buckets = Buckets(grads, bucket_bytes=3500)  # alone, then 3440 and 252 bytes
            assert len(buckets) == 3 and [len(b.slots) for b in buckets.buckets] == [1, 3, 2]
            buffers = [b.buffer for b in buckets.buckets]
        c.reset()
        buckets.allreduce(grads, c, op="average", ring=step == 2)
        assert all(b.buffer is x for b, x in zip(buckets.buckets, buffers))  # layout kept
        for i, (name, p) in enumerate(model.named_parameters()):
            assert p.grad is grads[name] and p.grad.data_ptr() == pointers[name]
            expected = total(c, p.numel(), np.float32, seed=10 * step + i) / c.size
            np.testing.assert_allclose(p.grad.numpy().reshape(-1), expected, rtol=1e-5,
                                       atol=1e-6)
        t = c.traffic["ring_allreduce" if step == 2 else "allreduce"]
        assert t.calls == len(buckets)  # one collective per bucket
        assert t.sent == sum(4 * ring_counts(b.size, c.size, c.rank)[0] for b in buckets.buckets)


@check
def counters_reset_and_barrier_counts_time_only(c: Communicator) -> None:
    c.allreduce(np.ones(10))
    assert c.bytes_sent > 0 and c.bytes_received > 0 and c.seconds > 0
    c.reset()
    assert c.traffic == {} and c.bytes_sent == c.bytes_received == 0 and c.seconds == 0
    c.barrier()
    t = c.traffic["barrier"]
    assert (t.calls, t.sent, t.received) == (1, 0, 0) and t.seconds > 0
    assert c.counters() == {"barrier": {"calls": 1, "sent": 0, "received": 0,
                                        "seconds": t.seconds}}


@check
def network_sweep_gives_every_rank_the_same_fit(c: Communicator) -> None:
    from d500.distributed.network import measure
    sizes = (8, 512, 32768, 1 << 20)
    for method in ("ping-pong", "allreduce"):
        net = measure(c, method, sizes=sizes, repeats=2)
        assert net.alpha >= 0 and net.beta > 0 and net.source == method
        assert [n for n, _ in net.samples] == list(sizes)
        assert all(t > 0 for _, t in net.samples)
        assert same_everywhere(c, np.array([net.alpha, net.beta]))


def main(names: list[str]) -> int:
    """Run the checks in order; rank 0 prints {"check", "size", "ok"} after each. A rank whose
    check fails prints {"check", "rank", "error"} and aborts the job (the other ranks may be
    waiting in a collective it will never call), as does a check still running after LIMIT s."""
    c = Communicator.for_world()
    for name in names or list(CHECKS):
        watchdog = threading.Timer(LIMIT, abort, (c, name, f"still running after {LIMIT} s"))
        watchdog.start()
        try:
            CHECKS[name](c)
        except Exception:  # noqa: BLE001  (any failure is reported, then the job ends)
            abort(c, name, traceback.format_exc(limit=4))
        watchdog.cancel()
        c.mpi.Barrier()
        if c.rank == 0:
            print(json.dumps({"check": name, "size": c.size, "ok": True}), flush=True)
    return 0


def abort(c: Communicator, name: str, error: str) -> None:
    print(json.dumps({"check": name, "size": c.size, "rank": c.rank, "error": error}),
          flush=True)
    wait_until_read()  # hydra could end the job with the report still in the pipe
    c.mpi.Abort(1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
