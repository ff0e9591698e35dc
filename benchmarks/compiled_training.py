"""torch eager against torch:compiled's training step, side by side, interleaved, in one run.

For each level-2 workload (digits-mlp and digits-lenet by default) both backends translate the
same model (seed 0) and build a momentum trainer; torch:compiled's first step traces and compiles
its forward+backward program (its compile time, and whether Inductor's cache under $D500_HOME
held it, are printed). Then both take steps on the same batches of the training split in
repetitions whose order alternates (benchmarks/ratio.interleave), so a burst of load from other
processes hits both alike. Printed: each one's median step time, the median per-repetition ratio
eager / compiled (> 1: the compiled step is faster) with its quartiles, the load average before
and after, and how far the two trainers' losses drifted apart (their rounding differs, and the
difference compounds over hundreds of steps on the same weights).

    .venv/bin/python benchmarks/compiled_training.py [--workloads digits-mlp,digits-lenet]
        [--batch 32] [--repetitions 30] [--number 10] [--threads 1] [--synthetic]
    (ResNet-20 at batch 64 without CIFAR-10 here: --workloads cifar10-resnet20 --batch 64
    --synthetic)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
from _args import repetitions
from ratio import interleave  # noqa: E402

from d500 import threads  # noqa: E402
from d500.backends import get  # noqa: E402
from d500.paths import rulebook  # noqa: E402
from d500.training import workloads  # noqa: E402
from d500.training.data import dataset  # noqa: E402
from d500.training.optimizers import make  # noqa: E402
from d500.training.trainable import trainable_model  # noqa: E402
from d500.workload import find  # noqa: E402


def stepper(trainer, x: np.ndarray, y: np.ndarray, batch: int, losses: list[float]):
    """One training step per call on the next batch of (x, y), its loss kept in `losses`."""
    count = len(y) // batch
    state = {"i": 0}

    def step() -> None:
        i = state["i"] % count
        state["i"] += 1
        losses.append(trainer.step({"input": x[i * batch:(i + 1) * batch],
                                    "labels": y[i * batch:(i + 1) * batch]}, 0.01))
    return step


def one(name: str, batch: int, repetitions: int, number: int, synthetic: bool) -> None:
    workload = workloads.load(find(name, rulebook() / "2-training", 2))
    model = trainable_model(workload, 0)
    if synthetic:  # a step's time does not depend on the values: random samples of its shape
        shape, classes = dataset.shape_of(workload.dataset)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((8 * batch, *shape)).astype(np.float32)
        y = rng.integers(0, classes, 8 * batch)
    else:
        parts, _ = dataset.parts(workload.dataset, None)
        x, y = parts.train.x, parts.train.y
    trainers = {b: get(b).prepare(model).trainer(make("momentum", lr=0.01), loss="loss")
                for b in ("torch", "torch:compiled")}
    losses = {b: [] for b in trainers}
    steps = {b: stepper(t, x, y, batch, losses[b]) for b, t in trainers.items()}
    t0 = time.perf_counter()
    steps["torch:compiled"]()
    first = time.perf_counter() - t0
    record = trainers["torch:compiled"].compile_record()
    steps["torch"]()
    print(f"{name}: torch:compiled's first step {first:.2f} s (compile "
          f"{record['compile_time']:.2f} s, {record['cache']} cache)", flush=True)
    load = os.getloadavg()[0]
    eager, compiled = interleave(steps["torch"], steps["torch:compiled"], repetitions, number)
    ratios = [e / c for e, c in zip(eager, compiled)]
    q = statistics.quantiles(ratios, n=4, method="inclusive")
    pairs = list(zip(losses["torch"], losses["torch:compiled"]))
    drift = [abs(a - b) / abs(a) for a, b in pairs]  # rounding differences compound over steps
    print(f"{name}, batch {batch}: eager {1e3 * statistics.median(eager):.3f} ms/step, "
          f"compiled {1e3 * statistics.median(compiled):.3f} ms/step, eager / compiled "
          f"{statistics.median(ratios):.3f} (IQR {q[0]:.3f}-{q[2]:.3f}, {len(ratios)} reps x "
          f"{number} steps); losses apart by {max(drift[:20]):.1e} relative over the first 20 "
          f"steps, {max(drift):.1e} over all {len(pairs)} (losses {min(a for a, _ in pairs):.3g}"
          f"-{max(a for a, _ in pairs):.3g}); load "
          f"{load:.2f} -> {os.getloadavg()[0]:.2f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="digits-mlp,digits-lenet")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repetitions", type=repetitions, default=30)
    ap.add_argument("--number", type=int, default=10, help="steps per backend per repetition")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--synthetic", action="store_true",
                    help="random batches of each dataset's sample shape (a dataset not here)")
    args = ap.parse_args()
    threads.configure(args.threads, threads.frameworks(["torch"]))
    print(f"{args.threads} thread(s); Inductor's cache: $D500_HOME/cache/torch-inductor")
    for name in args.workloads.split(","):
        one(name.strip(), args.batch, args.repetitions, args.number, args.synthetic)


if __name__ == "__main__":
    main()
