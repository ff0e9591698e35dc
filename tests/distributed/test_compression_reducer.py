"""The compressed exchange at N ranks: simulated on threads (LocalGroup) for every compressor, and
under a real `mpiexec -n 2` on mpi4py's buffer interface. Every rank gets the same average, the
byte counts follow the formulas and equal what was handed to the collectives, error feedback
keeps exactly what was not sent, PowerSGD's sent sum tracks the true sum."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from d500.distributed.compression import (
    COMPRESSORS,
    CompressedReducer,
    Memory,
    PowerSGD,
    ResidualMemory,
    TopK,
    compressed_allreduce,
    make,
)
from d500.distributed.compression.local import LocalGroup
from d500.errors import D500Error

SHAPES = [(128, 64), (128,), (64, 128), (64,), (10, 64), (10,)]
SIZES = [math.prod(s) for s in SHAPES]
PARAMS = {"topk": {"density": 0.01}, "randomk": {"density": 0.01}, "powersgd": {"rank": 2}}


def rank_gradients(world: int, seed: int = 0, shapes=SHAPES) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{f"p{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
            for _ in range(world)]


def expected_bytes(name: str) -> int:
    """The byte formulas, written out independently of the compressors' bytes()."""
    k = [math.ceil(0.01 * n) for n in SIZES]
    if name == "none":
        return sum(4 * n for n in SIZES)
    if name == "fp16":
        return sum(2 * n for n in SIZES)
    if name == "topk":
        return sum(8 * kk for kk in k)
    if name == "randomk":
        return sum(4 * kk for kk in k)
    if name == "qsgd":
        return sum(n + 4 * math.ceil(n / 512) for n in SIZES)
    if name == "efsignsgd":
        return sum(math.ceil(n / 8) + 4 for n in SIZES)
    assert name == "powersgd"  # every matrix here gains at rank 2; vectors are dense
    return sum((s[0] + s[1]) * 2 * 4 if len(s) == 2 else 4 * s[0] for s in SHAPES)


def exchange(name: str, grads: list[dict[str, np.ndarray]], steps: int = 1, **params):
    """Run `steps` reductions of `grads` on len(grads) simulated ranks: per rank (outputs of the
    last step, its StepBytes, the reducer), and the group (its recorded calls)."""
    group = LocalGroup(len(grads))

    def rank_main(rank: int):
        compressor, memory = make(name, {**PARAMS.get(name, {}), **params}, seed=3, worker=rank)
        reducer = CompressedReducer(compressor, memory, allreduce=group.allreduce(rank),
                                    allgather=group.allgather(rank), world=group.world)
        for _ in range(steps):
            out, step = reducer.reduce(grads[rank])
        return out, step, reducer

    return group.run(rank_main), group


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_every_rank_gets_the_same_average_and_the_bytes_of_the_formula(name):
    """3 ranks: identical results on every rank, in the gradients' shapes and dtype; sent bytes =
    the formula, and = the bytes this rank handed to its collectives (one fused buffer per step,
    two allreduces for PowerSGD)."""
    grads = rank_gradients(3)
    results, group = exchange(name, grads)
    dense = sum(4 * n for n in SIZES)
    for out, step, _ in results:
        assert (step.sent, step.dense) == (expected_bytes(name), dense)
        assert step.ratio == dense / step.sent
        for key, g in grads[0].items():
            assert out[key].shape == g.shape and out[key].dtype == np.float32
            np.testing.assert_array_equal(out[key], results[0][0][key])
    for calls in group.calls:
        if name == "powersgd":
            p_and_dense = 4 * (2 * (128 + 64 + 10) + 128 + 64 + 10)
            assert calls == [("allreduce", p_and_dense), ("allreduce", 4 * 2 * (64 + 128 + 64))]
            assert p_and_dense + 4 * 2 * 256 == expected_bytes(name)
        else:
            kind = "allreduce" if COMPRESSORS[name].summable else "allgather"
            assert calls == [(kind, expected_bytes(name))]


def test_dense_and_fp16_averages_are_the_mean():
    """Dense: the mean to float32 rounding. fp16: 4 casts and 3 fp16 additions, each off by at
    most 2**-11 of a magnitude <= sum_r |g_r|; the sum's error / 4 <= 2**-11 * sum_r |g_r|."""
    grads = rank_gradients(4, seed=1)
    dense, _ = exchange("none", grads)
    half, _ = exchange("fp16", grads)
    for key in grads[0]:
        stack = np.stack([g[key] for g in grads]).astype(np.float64)
        mean = stack.mean(axis=0)
        np.testing.assert_allclose(dense[0][0][key], mean, rtol=1e-6, atol=1e-7)
        error = np.abs(half[0][0][key] - mean)
        assert np.all(error <= 2.0**-11 * np.abs(stack).sum(axis=0) + 4 * 2.0**-24)
        assert error.max() > 1e-5  # it is half precision


def test_topk_exchange_sends_k_values_and_indices_and_keeps_exactly_the_rest():
    """The issue's correctness test at 2 ranks over 3 steps: each rank allgathers sum 8k bytes;
    the average is the mean of the ranks' own top-k; each rank's residual equals its compensated
    gradient minus what it sent, exactly; and every rank's result is the same."""
    steps = [rank_gradients(2, seed=s) for s in range(3)]
    group = LocalGroup(2)
    expected = sum(8 * math.ceil(0.01 * n) for n in SIZES)

    def rank_main(rank: int):
        memory = ResidualMemory()
        reducer = CompressedReducer(TopK(0.01), memory, allreduce=group.allreduce(rank),
                                    allgather=group.allgather(rank), world=2)
        mine = TopK(0.01)  # a twin compressing alongside, to know what this rank must send
        log = []
        for grads in steps:
            compensated = {k: memory.compensate(g, k) for k, g in grads[rank].items()}
            sent = {k: mine.decompress(*mine.compress(c, k)) for k, c in compensated.items()}
            out, step = reducer.reduce(grads[rank])
            assert step.sent == expected
            for k in grads[rank]:
                assert step.per_array[k] == 8 * math.ceil(0.01 * grads[rank][k].size)
                assert np.array_equal(memory.residual(k), compensated[k] - sent[k])
                assert np.all((memory.residual(k) == 0) | (sent[k] == 0))
            log.append((out, sent))
        return log

    logs = group.run(rank_main)
    assert group.calls[0] == group.calls[1] == [("allgather", expected)] * 3
    for (out0, sent0), (out1, sent1) in zip(logs[0], logs[1], strict=True):
        for k in out0:
            np.testing.assert_array_equal(out0[k], out1[k])
            np.testing.assert_allclose(out0[k], (sent0[k] + sent1[k]) / 2, rtol=1e-6)


def test_randomk_ranks_share_indices_and_sum_values():
    """Random-k is summable: one allreduce of 4k bytes, the average is exact at the shared
    indices (no index travels), zero elsewhere at step 1 (no residual yet)."""
    grads = rank_gradients(3, seed=2)
    results, group = exchange("randomk", grads)
    for key in grads[0]:
        mean = np.mean([g[key] for g in grads], axis=0)
        out = results[0][0][key]
        chosen = out != 0
        assert chosen.sum() == math.ceil(0.01 * mean.size)
        np.testing.assert_allclose(out[chosen], mean[chosen], rtol=1e-6)


def test_powersgd_is_exact_on_a_shared_rank_r_subspace_and_tracks_the_true_sum():
    """2 ranks whose 48x40 gradients share a rank-2 column space: the average comes back exact at
    rank 2. With full-rank gradients over 60 steps: sum of outputs + mean residual = sum of mean
    gradients (nothing lost), and the relative gap of the sums falls to < 0.2; without error
    feedback it stays > 0.5."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((48, 2)).astype(np.float32)
    grads = [{"w": (a @ rng.standard_normal((2, 40))).astype(np.float32),
              "b": rng.standard_normal(40).astype(np.float32)} for _ in range(2)]
    results, _ = exchange("powersgd", grads, steps=2)
    for key in ("w", "b"):
        mean = (grads[0][key] + grads[1][key]) / 2
        assert np.linalg.norm(results[1][0][key] - mean) <= 1e-5 * np.linalg.norm(mean)

    base = rng.standard_normal((32, 24)).astype(np.float32)
    series = [[base + 0.3 * rng.standard_normal((32, 24)).astype(np.float32) for _ in range(2)]
              for _ in range(60)]
    gaps = {}
    for feedback in (True, False):
        group = LocalGroup(2)

        def rank_main(rank: int, feedback=feedback, group=group):
            memory = ResidualMemory() if feedback else Memory()
            reducer = CompressedReducer(PowerSGD(rank=2, seed=5), memory, world=2,
                                        allreduce=group.allreduce(rank),
                                        allgather=group.allgather(rank))
            total = np.zeros((32, 24))
            for pair in series:
                total += reducer.reduce({"w": pair[rank]})[0]["w"]
            return total, memory.residual("w")

        (total, r0), (_, r1) = group.run(rank_main)
        truth = sum((p[0] + p[1]) / 2 for p in series)
        if feedback:
            np.testing.assert_allclose(total + (r0 + r1) / 2, truth, atol=1e-4)
        gaps[feedback] = np.linalg.norm(total - truth) / np.linalg.norm(truth)
    assert gaps[True] < 0.2 and gaps[False] > 0.5, gaps


def test_inplace_writes_the_average_into_torch_gradients():
    """Torch gradients reach the reducer as zero-copy NumPy views; inplace=True writes the average
    back into the tensors themselves."""
    torch = pytest.importorskip("torch")
    group = LocalGroup(2)
    tensors = [[torch.full((4, 3), float(r + 1)), torch.arange(5, dtype=torch.float32) * r]
               for r in range(2)]

    def rank_main(rank: int):
        views = {"w": tensors[rank][0].numpy(), "b": tensors[rank][1].numpy()}
        out, _ = compressed_allreduce(group.allreduce(rank), group.allgather(rank),
                                      COMPRESSORS["none"](), None, {}, 2)
        assert out == {}
        reducer = CompressedReducer(COMPRESSORS["fp16"](), allreduce=group.allreduce(rank),
                                    allgather=group.allgather(rank), world=2)
        out, _ = reducer.reduce(views, inplace=True)
        assert out["w"] is views["w"]

    group.run(rank_main)
    for r in range(2):
        assert torch.equal(tensors[r][0], torch.full((4, 3), 1.5))
        assert torch.equal(tensors[r][1], torch.arange(5, dtype=torch.float32) * 0.5)


def test_ranks_with_different_gradients_or_a_failing_rank_fail_without_hanging():
    group = LocalGroup(2, timeout=20)
    shapes = [[(10, 4)], [(10, 5)]]

    def rank_main(rank: int):
        grads = rank_gradients(1, shapes=shapes[rank])[0]
        reducer = CompressedReducer(TopK(0.5), allreduce=group.allreduce(rank),
                                    allgather=group.allgather(rank), world=2)
        return reducer.reduce(grads)

    with pytest.raises(D500Error, match=r"a rank sent (160|200) bytes, this rank (200|160); "
                                        r"the ranks' gradients differ in names or shapes"):
        group.run(rank_main)
    broken = LocalGroup(3, timeout=20)

    def failing(rank: int):
        if rank == 1:
            raise ValueError("rank 1 failed")
        return broken.allreduce(rank)(np.ones(3, np.float32))

    with pytest.raises(ValueError, match="rank 1 failed"):
        broken.run(failing)


def test_importing_compression_imports_no_framework():
    code = ("import sys, d500.distributed.compression; "
            "print(sorted(m for m in ('torch', 'tensorflow', 'mpi4py') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


MPI_SCRIPT = '''
import sys
import numpy as np
from mpi4py import MPI
from d500.distributed.compression import COMPRESSORS, CompressedReducer, make

comm = MPI.COMM_WORLD
rank, world = comm.Get_rank(), comm.Get_size()

def allreduce(buffer):
    comm.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)

def allgather(buffer):
    out = np.empty((world, buffer.size), dtype=buffer.dtype)
    comm.Allgather(buffer, out)
    return list(out)

shapes = [(128, 64), (128,), (64, 128), (64,), (10, 64), (10,)]
params = {"topk": {"density": 0.01}, "randomk": {"density": 0.01}, "powersgd": {"rank": 2}}
results = {}
for name in sorted(COMPRESSORS):
    compressor, memory = make(name, params.get(name, {}), seed=3, worker=rank)
    reducer = CompressedReducer(compressor, memory, allreduce=allreduce, allgather=allgather,
                                world=world)
    for step in range(3):
        rng = np.random.default_rng([step, rank])
        grads = {f"p{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
        out, sent = reducer.reduce(grads)
    for key, value in out.items():
        results[f"{name}/{key}"] = value
    results[f"{name}/sent"] = np.array([reducer.sent_bytes])
np.savez(sys.argv[1] + f"/rank{rank}.npz", **results)
'''


@pytest.mark.mpi
@pytest.mark.slow
def test_under_mpiexec_every_compressor_matches_the_simulation(tmp_path: Path):
    """`mpiexec -n 2` with mpi4py's buffer interface (fp16 summed by MPI itself): both ranks hold
    the same averages after 3 steps, bit for bit equal to the threaded simulation's, bytes too."""
    mpiexec = Path(sys.executable).with_name("mpiexec")
    if not mpiexec.exists():
        pytest.skip(f"no mpiexec beside {sys.executable}")
    script = tmp_path / "exchange.py"
    script.write_text(MPI_SCRIPT)
    run = subprocess.run([str(mpiexec), "-n", "2", sys.executable, str(script), str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    ranks = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(2)]
    def draw(step: int, rank: int) -> dict[str, np.ndarray]:  # as the script draws them
        rng = np.random.default_rng([step, rank])
        return {f"p{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(SHAPES)}

    steps = [[draw(step, r) for r in range(2)] for step in range(3)]
    for name in sorted(COMPRESSORS):
        group = LocalGroup(2)

        def rank_main(rank: int, name=name, group=group):
            compressor, memory = make(name, PARAMS.get(name, {}), seed=3, worker=rank)
            reducer = CompressedReducer(compressor, memory, allreduce=group.allreduce(rank),
                                        allgather=group.allgather(rank), world=2)
            for grads in steps:
                out, _ = reducer.reduce(grads[rank])
            return out, reducer.sent_bytes

        (simulated, sent), _ = group.run(rank_main)
        assert ranks[0][f"{name}/sent"][0] == ranks[1][f"{name}/sent"][0] == sent
        assert sent == 3 * expected_bytes(name)
        for key, value in simulated.items():
            np.testing.assert_array_equal(ranks[0][f"{name}/{key}"], ranks[1][f"{name}/{key}"])
            np.testing.assert_array_equal(ranks[0][f"{name}/{key}"], value)
