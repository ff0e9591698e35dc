"""Gradient compressors on real float32 arrays with fixed seeds: exact byte formulas, top-k's
residual being exactly what it did not send, error feedback delivering every coordinate, fp16
bounds, QSGD unbiasedness, EF-signSGD's packed signs, PowerSGD's exact rank-r round trip."""

from __future__ import annotations

import math

import numpy as np
import pytest

from d500.distributed.compression import (
    FP16,
    QSGD,
    EFSignSGD,
    Memory,
    NoneCompressor,
    PowerSGD,
    RandomK,
    ResidualMemory,
    TopK,
    make,
)
from d500.errors import ConfigError, UsageError

SHAPES = [(128, 64), (128,), (64, 128), (64,), (10, 64), (10,)]  # an MLP's weights and biases


def gradients(seed: int, shapes=SHAPES) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"p{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}


def test_topk_sends_k_values_and_indices_and_keeps_exactly_the_rest():
    """Bytes per array = k * (4 + 4), k = ceil(d * n): float32 values and int32 indices. The
    residual kept is compensated - sent, elementwise and exactly: zero where sent, the compensated
    gradient where not; the sent entries are the k largest magnitudes."""
    topk, memory = TopK(density=0.05), ResidualMemory()
    for step in range(3):  # from step 1 on, compensated = gradient + residual
        for name, g in gradients(step).items():
            compensated = memory.compensate(g, name)
            before = memory.residual(name)
            if before is not None:
                np.testing.assert_array_equal(compensated, g + before)
            payloads, ctx = topk.compress(compensated, name)
            values, index = payloads
            n, k = g.size, math.ceil(0.05 * g.size)
            assert (values.dtype, index.dtype) == (np.float32, np.int32)
            assert values.shape == index.shape == (k,)
            assert topk.bytes(payloads) == k * (4 + 4)
            flat = compensated.reshape(-1)
            np.testing.assert_array_equal(values, flat[index])
            unsent = np.setdiff1d(np.arange(n), index)
            if unsent.size:
                assert np.abs(values).min() >= np.abs(flat[unsent]).max()
            sent = topk.decompress(payloads, ctx)
            assert sent.shape == g.shape and sent.dtype == np.float32
            memory.update(name, compensated, sent)
            residual = memory.residual(name).reshape(-1)
            assert np.array_equal(residual, flat - sent.reshape(-1))
            assert np.all(residual[index] == 0)
            np.testing.assert_array_equal(residual[unsent], flat[unsent])


def test_topk_error_feedback_sends_every_coordinate_and_loses_nothing():
    """A constant gradient whose magnitudes span 3x: with error feedback every coordinate is sent
    within a bounded number of steps, and sent + residual = sum of gradients at every step."""
    rng = np.random.default_rng(7)
    g = (rng.uniform(0.5, 1.5, 1000) * rng.choice([-1, 1], 1000)).astype(np.float32)
    topk, memory = TopK(density=0.01), ResidualMemory()
    seen = np.zeros(g.size, bool)
    total_sent = np.zeros(g.size)
    for step in range(1, 401):
        c = memory.compensate(g, "w")
        payloads, ctx = topk.compress(c, "w")
        sent = topk.decompress(payloads, ctx)
        memory.update("w", c, sent)
        seen[payloads[1]] = True
        total_sent += sent
        np.testing.assert_allclose(total_sent + memory.residual("w"), step * g.astype(np.float64),
                                   rtol=1e-4)
        if seen.all():
            break
    assert seen.all(), f"{(~seen).sum()} coordinates never sent in 400 steps"
    assert step <= 400
    without = TopK(density=0.01)  # no memory: the same 10 coordinates every step
    first = without.compress(g, "w")[0][1]
    assert np.array_equal(without.compress(g, "w")[0][1], first)


def test_topk_at_one_percent_cuts_mlp_bytes_by_more_than_30x():
    """The issue's figure on the MLP's gradients: sum over arrays of 8 * ceil(0.01 n) bytes against
    4 * 17226 dense; k per array = 82, 2, 82, 1, 7, 1 -> 1400 bytes against 68904: 49.2x."""
    topk = TopK(density=0.01)
    grads = gradients(0)
    sent = sum(topk.bytes(topk.compress(g, n)[0]) for n, g in grads.items())
    dense = sum(g.nbytes for g in grads.values())
    assert (sent, dense) == (1400, 68904)
    assert dense / sent == pytest.approx(49.217, abs=1e-3)
    assert dense / sent >= 30


def test_fp16_round_trip_error_and_bytes():
    """Half the bytes; each value within fp16's rounding (relative 2**-11 in the normal range,
    absolute 2**-25 below it); out-of-range values overflow to inf, as documented."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(10_000) * np.exp(rng.uniform(-8, 8, 10_000))).astype(np.float32)
    x = x[np.abs(x) < 60000].reshape(-1, 4)
    fp16 = FP16()
    payloads, ctx = fp16.compress(x, "x")
    assert payloads[0].dtype == np.float16 and fp16.bytes(payloads) == x.size * 2
    y = fp16.decompress(payloads, ctx)
    assert y.shape == x.shape and y.dtype == np.float32
    normal = np.abs(x) >= 2.0**-14
    assert np.all(np.abs(y - x)[normal] <= np.abs(x)[normal] * 2.0**-11)
    assert np.all(np.abs(y - x)[~normal] <= 2.0**-25)
    assert np.max(np.abs(y - x)[normal] / np.abs(x)[normal]) > 2.0**-13  # it really rounds
    with np.errstate(over="ignore"):
        assert np.isinf(fp16.decompress(*fp16.compress(np.float32([70000.0]), "big")))[0]


def test_randomk_indices_depend_only_on_seed_name_and_step():
    """Random-k's indices come from (seed, name, step): two compressors standing for two ranks
    draw the same ones whatever the data and compression order, so only values (4k bytes) travel;
    they change from step to step, and another seed draws others."""
    rank0, rank1 = RandomK(density=0.1, seed=3), RandomK(density=0.1, seed=3)
    a, b = gradients(0), gradients(1)
    for _ in range(3):
        ctx0 = {n: rank0.compress(g, n)[1] for n, g in a.items()}
        ctx1 = {n: rank1.compress(b[n], n)[1] for n in reversed(list(b))}
        for n, g in a.items():
            k = math.ceil(0.1 * g.size)
            assert len(ctx0[n][2]) == k and len(set(ctx0[n][2].tolist())) == k
            np.testing.assert_array_equal(ctx0[n][2], ctx1[n][2])
    payloads, ctx = rank0.compress(a["p0"], "p0")
    assert len(payloads) == 1 and rank0.bytes(payloads) == 4 * math.ceil(0.1 * 128 * 64)
    assert not np.array_equal(ctx[2], ctx0["p0"][2])  # step 3 differs from step 2
    assert not np.array_equal(RandomK(0.1, seed=4).compress(a["p0"], "p0")[1][2],
                              RandomK(0.1, seed=3).compress(a["p0"], "p0")[1][2])
    sent = rank0.decompress(payloads, ctx).reshape(-1)
    np.testing.assert_array_equal(sent[ctx[2]], a["p0"].reshape(-1)[ctx[2]])
    assert np.count_nonzero(sent) == len(ctx[2])


def test_qsgd_is_unbiased_and_sends_a_byte_per_coordinate():
    """The mean of 2000 independent quantizations is the input within 5 standard errors (one
    quantization is off by up to ||v|| / s per coordinate, with variance <= (||v|| / s)^2 / 4);
    bytes = n + 4 * ceil(n / bucket); codes are int8 in [-127, 127]."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal(300).astype(np.float32)
    q = QSGD(bucket=128, seed=11)
    payloads, ctx = q.compress(x, "x")
    codes, norms = payloads
    assert codes.dtype == np.int8 and norms.dtype == np.float32 and norms.shape == (3,)
    assert q.bytes(payloads) == 300 + 4 * 3 and np.abs(codes.astype(int)).max() <= 127
    np.testing.assert_allclose(norms[0], np.linalg.norm(x[:128]), rtol=1e-6)
    samples = 2000
    total = np.zeros(300)
    single_error = 0.0
    for _ in range(samples):
        y = q.decompress(*q.compress(x, "x"))
        total += y
        single_error = max(single_error, np.abs(y - x).max())
    unit = np.repeat(norms / 127, 128)[:300]
    assert np.all(np.abs(total / samples - x) <= 5 * unit / (2 * math.sqrt(samples)))
    assert single_error > 10 * np.abs(total / samples - x).max()  # noise that averages out
    again = QSGD(bucket=128, seed=11).compress(x, "x")[0][0]
    np.testing.assert_array_equal(again, codes)  # seeded: reproducible
    other = QSGD(bucket=128, seed=11, worker=1).compress(x, "x")[0][0]
    assert not np.array_equal(other, codes)  # another rank rounds independently


@pytest.mark.parametrize("n", [1, 7, 8, 9, 1000, 8193])
def test_efsignsgd_packs_signs_and_a_scale(n):
    """Bytes = ceil(n / 8) + 4; decompressed = mean |p| * sign(p), with sign(0) = +1."""
    rng = np.random.default_rng(n)
    p = rng.standard_normal(n).astype(np.float32)
    p[::5] = 0.0
    sign = EFSignSGD()
    payloads, ctx = sign.compress(p, "p")
    assert payloads[0].dtype == np.uint8 and payloads[1].dtype == np.float32
    assert sign.bytes(payloads) == math.ceil(n / 8) + 4
    expected = np.float32(np.abs(p).mean()) * np.where(p < 0, -1.0, 1.0).astype(np.float32)
    np.testing.assert_allclose(sign.decompress(payloads, ctx), expected, rtol=1e-6)


def test_efsignsgd_error_feedback_recovers_the_gradient_on_average():
    """A constant gradient with magnitudes spanning 100x: the mean of what EF-signSGD sends over
    200 steps approaches the gradient (sent + residual = sum of gradients); without feedback it
    stays mean|g| * sign(g), far from g."""
    rng = np.random.default_rng(5)
    g = (np.exp(rng.uniform(-2.3, 2.3, 512)) * rng.choice([-1, 1], 512)).astype(np.float32)
    sign, memory = EFSignSGD(), ResidualMemory()
    total = np.zeros(512)
    steps = 200
    for step in range(1, steps + 1):
        c = memory.compensate(g, "g")
        payloads, ctx = sign.compress(c, "g")
        sent = sign.decompress(payloads, ctx)
        memory.update("g", c, sent)
        assert np.array_equal(memory.residual("g"), c - sent)
        total += sent
        np.testing.assert_allclose(total + memory.residual("g"), step * g.astype(np.float64),
                                   rtol=1e-4, atol=1e-3)
    with_ef = np.linalg.norm(total / steps - g) / np.linalg.norm(g)
    plain = sign.decompress(*sign.compress(g, "g"))
    without = np.linalg.norm(plain - g) / np.linalg.norm(g)
    assert with_ef < 0.05 < 0.5 < without


def rank_r(rng: np.random.Generator, n: int, m: int, r: int) -> np.ndarray:
    return (rng.standard_normal((n, r)) @ rng.standard_normal((r, m))).astype(np.float32)


def test_powersgd_reconstructs_a_rank_r_matrix_exactly_and_keeps_its_q():
    """A rank-2 64x48 matrix (and a 4-D conv weight of rank 2 as 16 x 27) comes back exact to
    float32 rounding at rank 2, at every step of the warm start; bytes = (n + m) * r * 4; a
    1-D array and a matrix too small to gain are sent dense."""
    rng = np.random.default_rng(0)
    psgd = PowerSGD(rank=2, seed=1)
    m = rank_r(rng, 64, 48, 2)
    conv = rank_r(rng, 16, 27, 2).reshape(16, 3, 3, 3)
    for step in range(3):
        for name, x in (("m", m), ("conv", conv)):
            payloads, ctx = psgd.compress(x, name)
            n, cols = x.shape[0], x.size // x.shape[0]
            assert [p.shape for p in payloads] == [(n, 2), (cols, 2)]
            assert psgd.bytes(payloads) == (n + cols) * 2 * 4
            np.testing.assert_allclose(payloads[0].T @ payloads[0], np.eye(2), atol=1e-5)
            y = psgd.decompress(payloads, ctx)
            assert y.shape == x.shape
            assert np.linalg.norm(y - x) <= 1e-5 * np.linalg.norm(x), (name, step)
            np.testing.assert_array_equal(psgd._q[name], payloads[1])  # next step's warm start
    full = rng.standard_normal((64, 48)).astype(np.float32)
    y = psgd.decompress(*psgd.compress(full, "full"))
    assert np.linalg.norm(y - full) > 0.5 * np.linalg.norm(full)  # rank 2 of a full-rank matrix
    assert psgd.matrix((64,)) is None and psgd.matrix((3, 3)) is None
    assert psgd.matrix((64, 48)) == (64, 48, 2) and psgd.matrix((16, 3, 3, 3)) == (16, 27, 2)
    bias = rng.standard_normal(64).astype(np.float32)
    payloads, ctx = psgd.compress(bias, "bias")
    assert psgd.bytes(payloads) == 64 * 4
    np.testing.assert_array_equal(psgd.decompress(payloads, ctx), bias)


def test_powersgd_warm_start_converges_to_the_best_rank_r_approximation():
    """Compressing the same full-rank matrix step after step is power iteration: from the random
    first Q the error falls to the truncated SVD's (Eckart-Young) optimum; a cold start each step
    (a new compressor) stays where it began."""
    rng = np.random.default_rng(4)
    u, _ = np.linalg.qr(rng.standard_normal((80, 80)))
    v, _ = np.linalg.qr(rng.standard_normal((60, 60)))
    spectrum = 0.6 ** np.arange(60)
    m = ((u[:, :60] * spectrum) @ v.T).astype(np.float32)
    best = math.sqrt(float(np.sum(spectrum[3:] ** 2)))  # rank-3 optimum
    warm = PowerSGD(rank=3, seed=2)
    errors = [float(np.linalg.norm(warm.decompress(*warm.compress(m, "m")) - m))
              for _ in range(15)]
    cold = []
    for _ in range(2):
        fresh = PowerSGD(rank=3, seed=2)
        cold.append(float(np.linalg.norm(fresh.decompress(*fresh.compress(m, "m")) - m)))
    assert errors[0] > 1.05 * best and cold[1] == cold[0] == pytest.approx(errors[0])
    assert errors[-1] == pytest.approx(best, rel=1e-3)
    assert all(b <= a * (1 + 1e-5) for a, b in zip(errors, errors[1:], strict=False))


def test_none_compressor_and_no_memory_are_dense():
    g = gradients(0)["p0"]
    none = NoneCompressor()
    payloads, ctx = none.compress(g, "p0")
    assert none.bytes(payloads) == g.nbytes
    np.testing.assert_array_equal(none.decompress(payloads, ctx), g)
    memory = Memory()
    assert memory.compensate(g, "p0") is g and memory.residual("p0") is None


def test_make_builds_by_name_and_refuses_bad_settings():
    compressor, memory = make("topk", {"density": 0.02})
    assert isinstance(compressor, TopK) and compressor.density == 0.02
    assert isinstance(memory, ResidualMemory)
    compressor, memory = make("qsgd", {}, seed=4, worker=3)
    assert (compressor.seed, compressor.worker) == (4, 3) and type(memory) is Memory
    compressor, memory = make("powersgd", {"rank": 4, "error_feedback": False}, seed=9)
    assert (compressor.rank, compressor.seed) == (4, 9) and type(memory) is Memory
    with pytest.raises(UsageError, match="unknown compressor 'top-k'.*efsignsgd.*topk; did you "
                                         "mean 'topk'"):
        make("top-k")
    with pytest.raises(ConfigError, match=r"sub.yaml: compression: compressor 'topk': density "
                                          r"must be a number in \(0, 1\], got 2"):
        make("topk", {"density": 2}, where="sub.yaml: compression")
    with pytest.raises(ConfigError, match="compressor 'fp16' has no parameter 'density'"):
        make("fp16", {"density": 0.1})
    with pytest.raises(ConfigError, match="'powersgd': rank must be an integer"):
        make("powersgd", {"rank": 1.5})
    with pytest.raises(ConfigError, match="has no parameter 'worker'"):
        make("qsgd", {"worker": 1})
    with pytest.raises(ConfigError, match="error_feedback must be true or false"):
        make("topk", {"error_feedback": "yes"})
    with pytest.raises(ConfigError, match="gradient 'w': compression needs a float NumPy array"):
        TopK().compress(np.arange(10), "w")
