"""The schemes' checks on real MPI ranks, run by test_schemes_mpi.py as
`mpiexec -n N python mpi_scheme_checks.py [CHECK ...]`: every rank runs every check named (default
all); one JSON line per check passed (with its measurements), and the first failure ends the job.

Each check trains the MLP builder's network on (1, 8, 8) digits on every rank with a scheme and
compares it with a single-process computation made on rank 0 (or every rank) from the same samples.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
import traceback
from collections.abc import Callable
from functools import cache

import numpy as np

from d500 import backends
from d500.builders import build
from d500.distributed.comm import Communicator, ring_counts
from d500.distributed.faults import wait_until_read
from d500.distributed.schemes import make, make_reducer
from d500.training.optimizers.registry import make as make_optimizer

CHECKS: dict[str, Callable[[Communicator], dict]] = {}
LIMIT = 180.0  # seconds a check may take before the job is aborted (the batchnorm
# checks' TensorFlow one: 11 s at 3 ranks on an idle 2-core machine, 19 s on one busy core)
B = 8  # per-rank batch
LR = 0.1


def check(fn: Callable[[Communicator], dict]) -> Callable[[Communicator], dict]:
    CHECKS[fn.__name__] = fn
    return fn


@cache
def digits() -> tuple[np.ndarray, np.ndarray]:
    """sklearn's bundled 8x8 digits (no download; its CSV read directly, which skips seconds of
    importing sklearn on every rank), in a fixed shuffled order."""
    import importlib.util
    from pathlib import Path
    root = Path(importlib.util.find_spec("sklearn").submodule_search_locations[0])
    table = np.loadtxt(root / "datasets" / "data" / "digits.csv.gz", delimiter=",")
    order = np.random.default_rng(0).permutation(len(table))
    x = (table[order, :-1] / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    return x, table[order, -1].astype(np.int64)


def share(step: int, rank: int, size: int, batch: int = B) -> dict[str, np.ndarray]:
    """Rank `rank`'s share of global batch `step` (size * batch samples, rank-major)."""
    x, y = digits()
    start = (step * size + rank) * batch % (len(y) - batch)
    return {"input": x[start:start + batch], "labels": y[start:start + batch]}


def global_batch(step: int, size: int) -> dict[str, np.ndarray]:
    """The union of every rank's share of step `step`, in rank order."""
    parts = [share(step, r, size) for r in range(size)]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def trainer(backend: str = "torch", optimizer: str = "sgd", seed: int = 0, **hp):
    """A fresh MLP trainer; `seed` picks the initial parameters (ranks differ with it)."""
    exe = backends.get(backend).prepare(build("mlp", (1, 8, 8), 10, seed=seed, loss=True))
    return exe.trainer(make_optimizer(optimizer, lr=LR, **hp), loss="loss")


def relative(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    """The largest per-parameter ||a - b|| / ||b||."""
    return max(float(np.linalg.norm(a[k].astype(np.float64) - b[k]) / np.linalg.norm(b[k]))
               for k in b)


def same_everywhere(c: Communicator, params: dict[str, np.ndarray]) -> bool:
    flat = np.concatenate([params[k].reshape(-1) for k in sorted(params)])
    rows = c.allgather(flat)
    return all(np.array_equal(rows[0], row) for row in rows)


def single_process(steps: int, size: int, optimizer: str = "sgd", **hp) -> dict:
    """Plain SGD on one process with the global batch size * B of every step."""
    t = trainer(optimizer=optimizer, **hp)
    for k in range(steps):
        t.step(global_batch(k, size), LR)
    return t.parameters()


def run_scheme(c: Communicator, name: str, steps: int, optimizer: str = "sgd", hp=None,
               **options) -> tuple[object, list[float]]:
    """`steps` steps of scheme `name` from rank-dependent initial parameters (start() must
    make them rank 0's); finish() is the caller's."""
    t = trainer(optimizer=optimizer, seed=c.rank, **(hp or {}))
    scheme = make(name, t, c, **options)
    scheme.start()
    losses = [scheme.step(share(k, c.rank, c.size), LR) for k in range(steps)]
    return scheme, losses


@check
def sync_equals_single_process_large_batch(c: Communicator) -> dict:
    steps = 20
    scheme, losses = run_scheme(c, "sync", steps)
    scheme.finish()
    assert "finish" not in c.traffic
    mine = scheme.trainer.parameters()
    assert same_everywhere(c, mine), "ranks ended with different parameters"
    error = relative(mine, single_process(steps, c.size))
    assert error < 1e-5, error
    assert losses[-1] < losses[0], losses
    b = sum(a.nbytes for a in mine.values())
    t = c.traffic["allreduce"]
    assert t.calls == steps, t  # one bucket: the MLP is 43 kB < 25 MB
    sent, received = ring_counts(b // 4, c.size, c.rank)
    assert (t.sent, t.received) == (steps * 4 * sent, steps * 4 * received), t
    return {"relative": error, "bytes_per_step": t.sent / steps}


@check
def ps_equals_single_process_large_batch(c: Communicator) -> dict:
    steps = 20
    scheme, _ = run_scheme(c, "ps", steps)
    mine = scheme.trainer.parameters()
    assert same_everywhere(c, mine), "ranks ended with different parameters"
    error = relative(mine, single_process(steps, c.size))
    assert error < 1e-5, error
    b = sum(a.nbytes for a in mine.values())
    reduce, bcast = c.traffic["reduce"], c.traffic["broadcast"]
    last = c.size - 1
    assert (reduce.sent, reduce.received) == (
        steps * b * (c.rank != 0), steps * b * (c.rank != last)), reduce
    # start() broadcast once more than the steps
    assert (bcast.sent, bcast.received) == (
        (steps + 1) * b * (c.rank != last), (steps + 1) * b * (c.rank != 0)), bcast
    return {"relative": error, "bytes_per_step": (reduce.sent + bcast.sent) / steps}


def simulate_dpsgd(size: int, steps: int, lian: bool) -> list[dict[str, np.ndarray]]:
    """The same gossip in one process: `size` trainers from rank 0's initial parameters, the
    mixing x_i <- ((x_i + x_{i-1}) + x_{i+1}) / 3 (P >= 3) or (x_0 + x_1) / 2 (P = 2) in
    float32, after the local step (or between gradient and update: Lian et al.'s order)."""
    ranks = [trainer() for _ in range(size)]
    for k in range(steps):
        grads = []
        for r, t in enumerate(ranks):
            if lian:
                grads.append({n: np.array(g) for n, g in t.gradients(share(k, r, size))[1].items()})
            else:
                t.step(share(k, r, size), LR)
        xs = [t.parameters() for t in ranks]
        for r, t in enumerate(ranks):
            if size == 2:
                mixed = {n: (xs[0][n] + xs[1][n]) / np.float32(2) for n in xs[r]}
            else:
                left, right = xs[(r - 1) % size], xs[(r + 1) % size]
                mixed = {n: (xs[r][n] + left[n] + right[n]) / np.float32(3) for n in xs[r]}
            t.set_parameters(mixed)
            if lian:
                t.apply(grads[r], LR)
    return [t.parameters() for t in ranks]


def dpsgd_matches_simulation(c: Communicator, lian: bool) -> dict:
    steps = 20
    scheme, _ = run_scheme(c, "dpsgd", steps, lian=lian)
    mine = scheme.trainer.parameters()
    error = relative(mine, simulate_dpsgd(c.size, steps, lian)[c.rank])
    assert error < 1e-5, error
    b = sum(a.nbytes for a in mine.values())
    if c.size == 2:  # (x_0 + x_1) / 2: one allreduce of the model, B each way
        t = c.traffic["allreduce"]
        assert (t.calls, t.sent, t.received) == (steps, steps * b, steps * b), t
        # W = [[1/2, 1/2], [1/2, 1/2]]: consensus after each mixing (Lian's order then
        # applies each rank's own gradient to it)
        assert same_everywhere(c, mine) != lian
    else:
        t = c.traffic["neighbour_exchange"]
        assert (t.sent, t.received) == (steps * 2 * b, steps * 2 * b), t
        assert not same_everywhere(c, mine), "the models agree: gossip is not an allreduce"
    with scheme.evaluated():  # the average of the models, restored after
        inside = scheme.trainer.parameters()
        assert same_everywhere(c, inside)
        rows = {n: c.allgather(np.ascontiguousarray(mine[n])) for n in mine}
        assert relative(inside, {n: rows[n].mean(0) for n in mine}) < 1e-6
    assert relative(scheme.trainer.parameters(), mine) == 0.0
    assert "evaluate" in c.traffic
    distance = scheme.figures()["consensus_distance"]
    assert (distance == 0.0) == (c.size == 2 and not lian) and distance < 0.05, distance
    scheme.finish()  # the final model: the average, on every rank
    final = scheme.trainer.parameters()
    assert same_everywhere(c, final) and relative(final, inside) < 1e-6
    assert ("finish" in c.traffic) == (c.size > 2 or lian), c.traffic
    return {"relative": error, "bytes_per_step": t.sent / steps}


@check
def dpsgd_matches_gossip_simulation(c: Communicator) -> dict:
    return dpsgd_matches_simulation(c, lian=False)


@check
def dpsgd_lian_order_matches_gossip_simulation(c: Communicator) -> dict:
    return dpsgd_matches_simulation(c, lian=True)


@check
def local_sgd_period_1_equals_sync_and_averages_every_period(c: Communicator) -> dict:
    steps = 20
    scheme, _ = run_scheme(c, "local_sgd", steps, period=1)
    error = relative(scheme.trainer.parameters(), single_process(steps, c.size))
    assert error < 1e-5, error
    c.reset()
    scheme, _ = run_scheme(c, "local_sgd", 7, period=3)  # averaged after steps 3 and 6
    assert c.traffic["allreduce"].calls == 2, c.traffic
    mine = scheme.trainer.parameters()
    assert not same_everywhere(c, mine)
    with scheme.evaluated():
        average = scheme.trainer.parameters()
        assert same_everywhere(c, average)
    assert relative(scheme.trainer.parameters(), mine) == 0.0
    # inside evaluated(): the averaging allreduce and this check's allgather, both moved
    assert c.traffic["allreduce"].calls == 2 and c.traffic["evaluate"].calls == 2, c.traffic
    scheme.finish()
    assert relative(scheme.trainer.parameters(), average) == 0.0
    assert c.traffic["allreduce"].calls == 2 and c.traffic["finish"].calls == 1, c.traffic
    f = scheme.figures()
    assert f["averagings"] == 2.0 and 0 < f["consensus_distance"] < 0.05, f
    return {"relative": error}


def sequential_sgd(steps: int, size: int) -> dict[str, np.ndarray]:
    """One process, one model: each step the shares of ranks 1..N-1 then rank 0's, one update
    each (batch B): what async_ps with max_staleness 0 must do."""
    t = trainer()
    for k in range(steps):
        for r in [*range(1, size), 0]:
            t.step(share(k, r, size), LR)
    return t.parameters()


@check
def async_ps_staleness_0_is_sequential_sgd(c: Communicator) -> dict:
    steps = 10
    scheme, _ = run_scheme(c, "async_ps", steps, max_staleness=0)
    scheme.finish()
    mine = scheme.trainer.parameters()  # finish() gave every rank the server's model
    assert same_everywhere(c, mine)
    error = relative(mine, sequential_sgd(steps, c.size))
    assert error < 1e-5, error
    if c.rank == 0:
        f = scheme.figures()
        assert f["staleness_max"] == 0 and f["gradients_applied"] == steps * c.size, f
    return {"relative": error}


def held_out_loss(t) -> float:
    x, y = digits()
    logits = t.predict({"input": x[-300:]}).astype(np.float64)
    logits -= logits.max(1, keepdims=True)
    return float(np.mean(np.log(np.exp(logits).sum(1)) - logits[np.arange(300), y[-300:]]))


@check
def async_ps_bounds_staleness_and_learns(c: Communicator) -> dict:
    report = {}
    for bound in sorted({1, c.size}):
        c.reset()
        steps = 30
        t = trainer(seed=c.rank)
        scheme = make("async_ps", t, c, max_staleness=bound)
        scheme.start()
        before = held_out_loss(t)
        for k in range(steps):
            scheme.step(share(k, c.rank, c.size), LR)
            if k == 14:
                with scheme.evaluated():
                    assert same_everywhere(c, t.parameters())
            if k % 10 == 4:  # the caller's own collectives between steps, after settle()
                scheme.settle()
                every = np.empty(c.size if c.rank == 0 else 0)
                c.mpi.Gather(np.array([float(k)]), every if c.rank == 0 else None, root=0)
                decision = np.array([float(c.rank == 0)])
                c.mpi.Bcast(decision, root=0)
                assert decision[0] == 1.0
        with scheme.evaluated():
            after = held_out_loss(t)
        scheme.finish()
        assert after < 0.7 * before, (before, after)
        n = sum(a.size for a in t.parameters().values())
        push, pull = c.traffic["ps_push"], c.traffic["ps_pull"]
        if c.rank == 0:
            f, hist = scheme.figures(), scheme.details()["staleness_histogram"]
            assert f["gradients_applied"] == steps * c.size == sum(hist), (f, hist)
            assert 1 <= f["staleness_max"] <= bound and len(hist) - 1 == f["staleness_max"], f
            assert push.received == (c.size - 1) * steps * (16 + 4 * n), push
            assert push.sent == 0 and pull.received == 0
            report[f"K={bound}"] = {"staleness_mean": f["staleness_mean"], "histogram": hist}
        else:
            assert push.sent == steps * (16 + 4 * n) and push.received == 0, push
            assert pull.received <= steps * (16 + 4 * n) and pull.calls == steps, pull
    return report


@check
def sync_topk_sends_the_compressors_bytes(c: Communicator) -> dict:
    from d500.distributed.compression.sparse import count
    steps = 10
    t = trainer(seed=c.rank)
    reducer = make_reducer(c, "topk", {"density": 0.01})
    scheme = make("sync", t, c, reducer=reducer)
    scheme.start()
    losses = [scheme.step(share(k, c.rank, c.size), LR) for k in range(steps)]
    assert all(np.isfinite(losses))
    gathered = dataclasses.replace(c.traffic["allgather"])
    assert "allreduce" not in c.traffic
    assert same_everywhere(c, t.parameters())
    payload = sum(8 * count(0.01, a.size) for a in t.parameters().values())
    f = scheme.figures()
    assert f["payload_bytes_per_step"] == payload, (f, payload)
    assert (gathered.calls, gathered.sent, gathered.received) == (
        steps, steps * (c.size - 1) * payload, steps * (c.size - 1) * payload), gathered
    dense = sum(a.nbytes for a in t.parameters().values())
    assert f["compression_ratio"] == dense / payload
    return {"payload_bytes_per_step": payload, "ratio": f["compression_ratio"]}


@check
def ps_with_compression_matches_sync(c: Communicator) -> dict:
    steps = 8
    results = {}
    for scheme_name in ("sync", "ps"):
        c.reset()
        t = trainer(seed=c.rank)
        scheme = make(scheme_name, t, c, reducer=make_reducer(c, "topk", {"density": 0.05}))
        scheme.start()
        for k in range(steps):
            scheme.step(share(k, c.rank, c.size), LR)
        results[scheme_name] = t.parameters()
    assert same_everywhere(c, results["ps"])
    error = relative(results["ps"], results["sync"])  # the same allgathered top-k payloads
    assert error < 1e-6, error
    c.reset()  # fp16 is summable: reduced to rank 0 (2 bytes per element, counted as reduce)
    t = trainer(seed=c.rank)
    scheme = make("ps", t, c, reducer=make_reducer(c, "fp16"))
    scheme.start()
    for k in range(steps):
        scheme.step(share(k, c.rank, c.size), LR)
    assert same_everywhere(c, t.parameters())
    n = sum(a.size for a in t.parameters().values())
    reduce = c.traffic["reduce"]
    assert (reduce.sent, reduce.received) == (
        steps * 2 * n * (c.rank != 0), steps * 2 * n * (c.rank != c.size - 1)), reduce
    return {"relative": error}


def main() -> int:
    from mpi4py import MPI
    c = Communicator(MPI.COMM_WORLD)
    names = sys.argv[1:] or list(CHECKS)
    for name in names:
        c.reset()
        c.barrier()
        c.reset()
        done = threading.Event()
        watchdog = threading.Thread(target=_watch, args=(done, name, c.rank), daemon=True)
        watchdog.start()
        try:
            start = time.perf_counter()
            report = CHECKS[name](c) or {}
            report = {"check": name, "size": c.size, "ok": True, **report,
                      "seconds": round(time.perf_counter() - start, 3)}
        except BaseException:  # noqa: BLE001 - report it and end every rank
            done.set()
            print(json.dumps({"check": name, "size": c.size, "rank": c.rank,
                              "error": traceback.format_exc()}), flush=True)
            wait_until_read()  # hydra could end the job with the report still in the pipe
            MPI.COMM_WORLD.Abort(1)
            return 1
        done.set()
        if c.rank == 0:
            print(json.dumps(report), flush=True)
    return 0


def _watch(done: threading.Event, name: str, rank: int) -> None:
    if not done.wait(LIMIT):
        print(json.dumps({"check": name, "rank": rank,
                          "error": f"timed out after {LIMIT:g} s"}), flush=True)
        wait_until_read()
        from mpi4py import MPI
        MPI.COMM_WORLD.Abort(3)


if __name__ == "__main__":
    sys.exit(main())
