"""bf16 against fp32 training-step time on this CPU, side by side in one process.

For the digits MLP (batch 32) and the text-lm transformer's shape (2 layers, width 64, context
64, batch 16; learnable synthetic windows, no corpus needed), on torch and TensorFlow: an fp32
and a bf16 trainer (d500.training.precision) each take `--number` steps per repetition, in
alternating order (benchmarks/ratio.interleave); it prints ms per step of each and the median
per-repetition ratio bf16/fp32 (above 1: bf16 slower) with its quartiles, whether the CPU has
native bf16 (avx512_bf16, amx_bf16) and the load average before and after.

    .venv/bin/python benchmarks/precision.py [--backends torch tensorflow] [--repetitions 7]
        [--number 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from itertools import cycle
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _args import repetitions
from ratio import interleave  # noqa: E402


def cases() -> dict[str, tuple[object, list[dict], tuple[str, dict], float]]:
    """name -> (model, batches, (optimizer, hyperparameters), lr)."""
    import numpy as np
    from sklearn.datasets import load_digits

    from d500.builders import build, build_lm
    data = load_digits()
    x, y = (data.images / 16.0).astype(np.float32)[:, None], data.target.astype(np.int64)
    digits = [{"input": x[i:i + 32], "labels": y[i:i + 32]} for i in range(0, 32 * 20, 32)]
    rng = np.random.default_rng(0)
    windows = []
    for _ in range(8):
        tokens = (rng.integers(0, 1024, (16, 1)) + rng.integers(1, 8, (16, 1))
                  * np.arange(65)) % 1024
        windows.append({"input": tokens[:, :-1].astype(np.int64),
                        "labels": tokens[:, 1:].astype(np.int64)})
    return {
        "digits mlp, batch 32": (build("mlp", (1, 8, 8), 10, seed=0, loss=True), digits,
                                 ("momentum", {"lr": 0.05}), 0.05),
        "text-lm shape, batch 16": (build_lm("transformer", 64, 1024, seed=0, loss=True,
                                             layers=2, width=64, heads=4, tied=True), windows,
                                    ("adamw", {"lr": 2e-3}), 2e-3),
    }


def stepper(backend: str, model, batches, optimizer: tuple[str, dict], lr: float, low: str):
    """One `step` at precision `low` on the next batch, as a callable."""
    from d500 import backends
    from d500.training.optimizers import make
    t = backends.get(backend).prepare(model).trainer(make(optimizer[0], **optimizer[1]),
                                                     loss="loss", precision=low)
    feed = cycle(batches)
    return lambda: t.step(next(feed), lr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", nargs="+", default=["torch", "tensorflow"])
    p.add_argument("--repetitions", type=repetitions, default=7)
    p.add_argument("--number", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    from d500 import provenance, threads
    from d500.training.precision import cpu_flags
    threads.configure(args.threads, threads.frameworks(args.backends))
    print(f"load before: {provenance.loadavg_text()}; CPU {provenance.cpu()['model']}, native "
          f"bf16 {cpu_flags()}; {args.threads} thread(s), {args.repetitions} repetitions of "
          f"{args.number} steps")
    for backend in args.backends:
        for name, (model, batches, optimizer, lr) in cases().items():
            fp32 = stepper(backend, model, batches, optimizer, lr, "fp32")
            bf16 = stepper(backend, model, batches, optimizer, lr, "bf16")
            fp32(), bf16()  # warm-up: tracing, first allocations
            t32, t16 = interleave(fp32, bf16, args.repetitions, args.number)
            ratios = [b / a for a, b in zip(t32, t16)]
            q = statistics.quantiles(ratios, n=4, method="inclusive")
            print(f"{backend:<10} {name:<24} fp32 {statistics.median(t32) * 1e3:8.2f} ms/step  "
                  f"bf16 {statistics.median(t16) * 1e3:8.2f} ms/step  bf16/fp32 "
                  f"{statistics.median(ratios):.2f} (IQR {q[0]:.2f}-{q[2]:.2f})", flush=True)
    print(f"load after: {provenance.loadavg_text()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
