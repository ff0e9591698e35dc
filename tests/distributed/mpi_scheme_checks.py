"""The schemes' checks on real MPI ranks, run by test_schemes_mpi.py as
`mpiexec -n N python mpi_scheme_checks.py [CHECK ...]`: every rank runs every check named (default
all); one JSON line per check passed (with its measurements), and the first failure ends the job.

Each check trains the MLP builder's network on (1, 8, 8) digits on every rank with a scheme and
compares it with a single-process computation made on rank 0 (or every rank) from the same samples.
"""

from __future__ import annotations

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
from d500.distributed.schemes import make, make_reducer
from d500.training.optimizers.registry import make as make_optimizer

CHECKS: dict[str, Callable[[Communicator], dict]] = {}
LIMIT = 60.0  # seconds a check may take before the job is aborted
B = 8  # per-rank batch
LR = 0.1


def check(fn: Callable[[Communicator], dict]) -> Callable[[Communicator], dict]:
    CHECKS[fn.__name__] = fn
    return fn


@cache
def digits() -> tuple[np.ndarray, np.ndarray]:
    """sklearn's bundled 8x8 digits (no download), in a fixed shuffled order."""
    from sklearn.datasets import load_digits
    data = load_digits()
    order = np.random.default_rng(0).permutation(len(data.target))
    return (data.images[order] / 16.0).astype(np.float32)[:, None], \
        data.target[order].astype(np.int64)


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
    make them rank 0's)."""
    t = trainer(optimizer=optimizer, seed=c.rank, **(hp or {}))
    scheme = make(name, t, c, **options)
    scheme.start()
    losses = [scheme.step(share(k, c.rank, c.size), LR) for k in range(steps)]
    scheme.finish()
    return scheme, losses


@check
def sync_equals_single_process_large_batch(c: Communicator) -> dict:
    steps = 20
    scheme, losses = run_scheme(c, "sync", steps)
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
        from mpi4py import MPI
        MPI.COMM_WORLD.Abort(3)


if __name__ == "__main__":
    sys.exit(main())
