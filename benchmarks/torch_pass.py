"""The torch backend's wrapper around a pipeline stage's pass, in one process: d500's pass
(StageModel.forward then its backward; the last stage's StageModel.loss) beside the same
translated module's forward and autograd backward called directly, in CPU time of this thread
(time.thread_time: other processes on the cores do not inflate it), alternating, median ratio.

The model and cut are pipeline_trace.py's: digits-mlp at `--batch`, 2 stages, GPipe M = 1.

    .venv/bin/python benchmarks/torch_pass.py [--batch 4096] [--reps 200]
    .venv/bin/python benchmarks/torch_pass.py --tree /tmp/before --tree .

With --tree (repeatable), each tree's d500 runs the benchmark in its own process, the trees
taking turns for `--rounds` rounds, and each round's figures are printed: before and after a
change side by side in one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np


def passes(batch: int) -> dict[str, tuple[Any, Any]]:
    """Per stage: (d500's pass, the direct pass), each a function of no argument."""
    import torch

    from d500 import backends
    from d500.builders import build
    from d500.distributed.pipeline.partition import partition
    from d500.distributed.pipeline.stage import StageModel
    from d500.training.optimizers.registry import make

    model = build("mlp", (1, 8, 8), 10, seed=0, loss=True)
    part = partition(model, 2)
    rng = np.random.default_rng(0)
    batch_feeds = {"input": rng.random((batch, 1, 8, 8), dtype=np.float32),
                   "labels": rng.integers(0, 10, batch).astype(np.int64)}
    first, last = (StageModel(part, i, backends.get("torch"), make("sgd", lr=0.01))
                   for i in (0, 1))
    sent, kept, _ = first.forward(first.inputs([], batch_feeds))
    grads_of_sent = [np.ones_like(s) / s.size for s in sent]
    feeds0, feeds1 = first.inputs([], batch_feeds), last.inputs(sent, batch_feeds)

    def d500_first() -> None:
        _, back, _ = first.forward(feeds0)
        first.backward(back, grads_of_sent)

    def d500_last() -> None:
        last.loss(feeds1, 1.0)

    def direct(stage: StageModel, feeds: dict[str, np.ndarray], seeds: dict[str, Any]) -> Any:
        module, exe = stage.exe.native, stage.exe
        params = [module.values[n] for n in stage.params]
        names = list(seeds)

        def run() -> None:
            with torch.enable_grad():
                named = {n: torch.from_numpy(v) for n, v in feeds.items()}
                for n in stage.info.receives:
                    named[n] = named[n].detach().requires_grad_(True)
                outs = module(**named)
                ys = [outs[exe.output_index(n)] for n in names]
                targets = params + [named[n] for n in stage.info.receives]
                grads = torch.autograd.grad(ys, targets, [seeds[n] for n in names])
            [o.detach().numpy() for o in outs], [g.numpy() for g in grads]
        return run

    seeds0 = {n: torch.from_numpy(g) for n, g in zip(first.sent_names, grads_of_sent)}
    seeds1 = {last.loss_name: torch.tensor(1.0)}
    return {"stage 0 (forward, backward)": (d500_first, direct(first, feeds0, seeds0)),
            "stage 1 (loss: forward+backward)": (d500_last, direct(last, feeds1, seeds1))}


def measure(batch: int, reps: int) -> None:
    """Print, per stage, d500's and the direct pass's median CPU ms and their median ratio."""
    import d500
    print(f"  d500 from {os.path.dirname(d500.__file__)}", flush=True)
    for label, (ours, theirs) in passes(batch).items():
        for fn in (ours, theirs, ours, theirs):  # warm up
            fn()
        mine, direct = [], []
        for r in range(reps):
            order = [(ours, mine), (theirs, direct)]
            for fn, acc in order if r % 2 == 0 else order[::-1]:
                start = time.thread_time()
                fn()
                acc.append(time.thread_time() - start)
        ratio = statistics.median(a / b for a, b in zip(mine, direct))
        print(f"  {label:<34} d500 {1e3 * statistics.median(mine):6.3f} ms   direct "
              f"{1e3 * statistics.median(direct):6.3f} ms   d500/direct {ratio:.3f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4096, help="samples per pass")
    parser.add_argument("--reps", type=int, default=200, help="passes of each, alternating")
    parser.add_argument("--tree", action="append", default=[],
                        help="a source tree whose d500 to measure (repeatable; see above)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the trees (--tree)")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    torch.set_num_threads(1)
    if not args.tree:
        measure(args.batch, args.reps)
        return 0
    here = os.path.abspath(__file__)
    for r in range(args.rounds):
        for tree in args.tree:
            print(f"round {r + 1}, tree {tree}:", flush=True)
            env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
            subprocess.run([sys.executable, here, "--batch", str(args.batch),
                            "--reps", str(args.reps)], env=env, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
