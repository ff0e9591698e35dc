"""XLA's CPU client as d500 starts it against XLA's own start, on d500's digits-mlp training
step, side by side: JAX's (async dispatch off, its compile pool on the count's cores:
d500/backends/jax/framework.py; XLA's own: NPROC alone sizing its intra-op pool) or
TensorFlow's under tensorflow:xla (its compile pool started on the count's cores:
d500/backends/tensorflow/framework.py start_xla; XLA's own: started by the first step).

Each round runs one process of each, in alternating order: it sets the threads, builds digits-mlp
with sgd-momentum's recipe on the backend, times its first step (the compile) and STEPS more
steps on a fixed random batch, and reads its threads' runnable time (/proc's schedstat: ran and
waited for a CPU; what d500.training.cpu judges a worker by) over each. It prints each round,
the medians of each start, the median per-round ratio d500/XLA's own of the compile and the step
time (below 1: d500's start is faster) and the runnable time per thread and second of each.

    .venv/bin/python benchmarks/xla_threads.py [--backend jax|tensorflow:xla] [--threads 1]
        [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from _args import repetitions

ROOT = Path(__file__).resolve().parents[1]
STEPS = 300

CHILD = r'''
import json, os, sys, time
import numpy as np
how, n, steps, name = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]


def runnable():
    """Seconds this process's live threads ran and waited for a CPU, in all."""
    total = 0.0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/schedstat") as f:
                ran, waited, _ = f.read().split()
        except OSError:
            continue
        total += (int(ran) + int(waited)) / 1e9
    return total


from d500 import threads
if name != "jax":
    threads.configure(n, ["tensorflow"])
    if how == "own":  # XLA's own start: by the first step's compile
        from d500.backends.tensorflow import framework
        framework._xla_started.append(True)
elif how == "d500":
    threads.configure(n, ["jax"])
else:  # XLA's own start, its intra-op pool sized as d500 sizes it
    os.environ["NPROC"] = str(n)
    import jax
    jax.devices()
    del os.environ["NPROC"]
from d500.training import submission, trainer, workloads
workload = workloads.load(os.path.join("levels", "2-training", "digits-mlp.yaml"))
recipe = submission.load(os.path.join("submissions", "sgd-momentum")).recipe
backend, model = trainer.ready(workload, recipe, name, None, 0)
train = backend.prepare(model).trainer(recipe.optimizer(backend.name), loss="loss",
                                       native=recipe.native, precision=recipe.precision)
rng = np.random.default_rng(0)
feeds = {"input": rng.random((recipe.batch_size, 1, 8, 8), dtype=np.float32),
         "labels": rng.integers(0, 10, recipe.batch_size).astype(np.int64)}
found = {}
for what, count in (("compile", 1), ("steps", steps)):
    r, t = runnable(), time.perf_counter()
    for _ in range(count):
        train.step(feeds, 0.01)
    wall = time.perf_counter() - t
    found[what] = {"s": wall, "runnable": (runnable() - r) / (n * wall)}
print(json.dumps(found))
'''


def child(how: str, threads: int, backend: str) -> dict:
    """One process's figures: {"compile"|"steps": {"s", "runnable"}}."""
    done = subprocess.run([sys.executable, "-c", CHILD, how, str(threads), str(STEPS), backend],
                          cwd=ROOT,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, capture_output=True,
                          text=True, timeout=600)
    if done.returncode:
        raise SystemExit(done.stderr)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="jax", choices=("jax", "tensorflow:xla"),
                        help="whose XLA (default jax)")
    parser.add_argument("--threads", type=int, default=1, help="the count (default 1)")
    parser.add_argument("--rounds", type=repetitions, default=5, help="rounds (default 5)")
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()[0]:.2f}; {args.backend} --threads {args.threads}, "
          f"{STEPS} steps")
    seen: dict[str, list[dict]] = {"d500": [], "own": []}
    for r in range(args.rounds):
        for how in (("d500", "own") if r % 2 == 0 else ("own", "d500")):
            got = child(how, args.threads, args.backend)
            seen[how].append(got)
            print(f"round {r} {how:4}  compile {got['compile']['s']:.3f} s runnable "
                  f"{got['compile']['runnable']:.2f}x   {STEPS} steps {got['steps']['s']:.3f} s "
                  f"runnable {got['steps']['runnable']:.2f}x   load {os.getloadavg()[0]:.1f}",
                  flush=True)
    for what in ("compile", "steps"):
        for how in ("own", "d500"):
            runs = seen[how]
            print(f"{what:8} {how:4} median {statistics.median(g[what]['s'] for g in runs):.3f} "
                  f"s, runnable {statistics.median(g[what]['runnable'] for g in runs):.2f}x")
        ratios = [d[what]["s"] / o[what]["s"] for d, o in zip(seen["d500"], seen["own"])]
        print(f"{what:8} time d500/own: median {statistics.median(ratios):.3f} "
              f"(range {min(ratios):.3f}-{max(ratios):.3f}, {len(ratios)} rounds)")
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
