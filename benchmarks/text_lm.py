"""The text-lm workload's training step on each trainable backend, interleaved with torch's.

The model is the workload's transformer (d500.builders.build_lm with levels/2-training/text-lm's
fields), trained through `Executable.trainer(...).step` with the framework-neutral AdamW on real
windows of the python-stdlib corpus (its training split, prepared in $D500_HOME's cache). Each
other backend runs in alternating repetitions with torch (fp32) in one process; it prints tokens
per second of each and the median per-repetition ratio backend/torch with its quartiles, whether
the CPU has native bf16, and the load average. `BACKEND@PRECISION` trains in that precision
(d500.training.precision): `torch@bf16`'s ratio is the bf16/fp32 throughput ratio on torch.

    .venv/bin/python benchmarks/text_lm.py [--against tensorflow jax torch:compiled torch@bf16]
        [--repetitions 7] [--number 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from itertools import cycle
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from _args import repetitions
from ratio import interleave  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def trainer_on(label: str, model, batches):
    """One `step` on the next batch, as a callable; `label` is BACKEND or BACKEND@PRECISION."""
    from d500 import backends
    from d500.training.optimizers import make
    backend, _, low = label.partition("@")
    t = backends.get(backend).prepare(model).trainer(make("adamw", lr=0.002, weight_decay=0.01),
                                                     loss="loss", precision=low or "fp32")
    feed = cycle(batches)
    return lambda: t.step(next(feed), lr=0.002)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", nargs="+",
                        default=["tensorflow", "jax", "torch:compiled", "torch@bf16",
                                 "tensorflow@bf16"],
                        help="BACKEND or BACKEND@PRECISION (bf16), each timed against torch")
    parser.add_argument("--repetitions", type=repetitions, default=7)
    parser.add_argument("--number", type=int, default=5, help="steps per repetition")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    import numpy as np

    from d500 import threads
    from d500.training import workloads
    from d500.training.data.dataset import parts
    from d500.training.precision import cpu_flags
    from d500.training.trainable import trainable_model
    names = [label.partition("@")[0] for label in args.against]
    threads.configure(args.threads, threads.frameworks(["torch", *names]))
    wl = workloads.load(ROOT / "levels" / "2-training" / "text-lm.yaml")
    model = trainable_model(wl, seed=0)
    train = parts(wl.dataset)[0].train
    rng = np.random.default_rng(0)
    batches = [{"input": train.x[i], "labels": train.y[i]}
               for i in (rng.integers(0, len(train), args.batch) for _ in range(8))]
    tokens = args.batch * wl.dataset["context"]
    base = trainer_on("torch", model, batches)
    print(f"text-lm step, batch {args.batch} x {wl.dataset['context']} tokens, "
          f"{args.threads} thread(s), load {os.getloadavg()[0]:.1f}; native bf16: "
          f"{', '.join(f for f, on in sorted(cpu_flags().items()) if on) or 'none'}")
    for backend in args.against:
        other = trainer_on(backend, model, batches)
        for _ in range(2):  # translation, tracing and compiles (JAX traces twice): not timed
            other(), base()
        number = 1 if backend == "reference" else args.number
        reps = min(args.repetitions, 3) if backend == "reference" else args.repetitions
        a, b = interleave(other, base, reps, number)
        ratios = [t / o for o, t in zip(a, b)]  # throughput backend / torch, per repetition
        q = statistics.quantiles(ratios, n=4, method="inclusive")
        print(f"{backend:<15} {tokens / statistics.median(a):8.0f} tokens/s   torch "
              f"{tokens / statistics.median(b):8.0f} tokens/s   ratio {backend}/torch "
              f"{statistics.median(ratios):.3f} (IQR {q[0]:.3f}-{q[2]:.3f}, {reps} reps)")
    print(f"load at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
