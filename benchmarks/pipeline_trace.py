"""Where a pipeline step's time goes, d500's beside torch.distributed.pipelining's, at 2 ranks: each
rank's passes (forward, backward, the last stage's joint forward and backward, the update) and
waits, timed by wrapping them, in wall and CPU milliseconds and page faults a step; then the
time d500's activations and gradients take from the end of the pass that sent them to the end
of the receive that got them.

Both pipelines run the same 2 stages of the same model (benchmarks/pipeline_bubble.py's setup,
GPipe, M micro-batches) in the same processes, in alternate rounds of `--steps` steps (the first
round not counted). Printed per rank: for each phase, its calls, its median wall and CPU ms, and
its page faults a step (minor faults: memory the process touched for the first time, or again
after the allocator returned it). CPU time is this process's, which other processes on the cores
do not inflate: on a loaded machine compare passes by it. What a rank spends outside the phases
shown is its step less their sum.

    .venv/bin/python benchmarks/pipeline_trace.py [--batch 4096] [--micro 1] [--rounds 6]
    .venv/bin/python benchmarks/pipeline_trace.py --keep-heap

--keep-heap tells glibc's malloc, in both ranks, to keep the memory freed (mallopt: no trimming,
no mmap below 256 MiB), so that a buffer freed and allocated again each step is not faulted in
again: what the page faults cost each pipeline.
"""

from __future__ import annotations

import argparse
import collections
import resource
import statistics
import sys
import time
from typing import Any

import numpy as np
from _args import repetitions
from _mpi import parse_under_mpiexec

from d500.distributed.launch import share_cores

Span = tuple[float, float, float, int]  # wall start, wall end, CPU seconds, page faults


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4096, help="samples per step")
    parser.add_argument("--micro", type=int, default=1, help="micro-batches (GPipe)")
    parser.add_argument("--steps", type=int, default=10, help="steps per round")
    parser.add_argument("--rounds", type=repetitions, default=6,
                        help="rounds (the first not counted)")
    parser.add_argument("--keep-heap", action="store_true",
                        help="glibc keeps freed memory (see the module docstring)")
    args = parse_under_mpiexec(parser, argv, __file__)
    if args.keep_heap:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
        libc.mallopt(-3, 1 << 28)  # M_MMAP_THRESHOLD
    share_cores()
    import torch.distributed.pipelining.schedules as torch_schedules
    import torch.distributed.pipelining.stage as torch_stage
    from mpi4py import MPI

    from d500 import backends
    from d500.builders import build
    from d500.distributed import comm as d500_comm
    from d500.distributed.comm import Communicator
    from d500.distributed.grid import Grid
    from d500.distributed.pipeline import stage as d500_stage
    from d500.distributed.pipeline.scheme import build as pipeline
    from d500.distributed.pipelining import build as pipelining
    from d500.distributed.spec import parse
    from d500.training.optimizers.registry import make

    spans: dict[str, list[Span]] = collections.defaultdict(list)
    counting = [False]
    timed = _timer(spans, counting)
    timed(d500_stage.StageModel, "forward", "d500 forward")
    timed(d500_stage.StageModel, "loss", "d500 forward+backward (last)")
    timed(d500_stage.StageModel, "backward", "d500 backward")
    timed(d500_comm.Communicator, "recv", "d500 receive (waiting)")
    timed(torch_stage, "stage_backward", "torch backward")
    timed(torch_schedules, "_wait_batch_p2p", "torch messages (waiting)")

    c = Communicator(MPI.COMM_WORLD)
    model = build("mlp", (1, 8, 8), 10, seed=0, loss=True)
    rng = np.random.default_rng(0)
    feeds = {"input": rng.random((args.batch, 1, 8, 8), dtype=np.float32),
             "labels": rng.integers(0, 10, args.batch).astype(np.int64)}
    setting = {"pipeline": c.size, "micro_batches": args.micro, "schedule": "gpipe"}
    spec = parse({"scheme": "sync", **setting}, "benchmark")
    ours = pipeline(model, spec, Grid(c, spec.dims(c.size)), backends.get("torch"),
                    make("sgd", lr=0.01), False)
    spec = parse({"scheme": "pipelining", **setting}, "benchmark")
    native = pipelining(model, spec, c, backends.get("torch"), make("sgd", lr=0.01), False,
                        60.0, args.batch)[1]
    native.start()
    timed(ours.trainer, "apply", "d500 update")
    timed(native.module, "forward", "torch forward")
    timed(native.trainer.optimizer, "step", "torch update")
    timed(ours, "step", "d500 STEP")
    timed(native, "step", "torch STEP")
    for r in range(args.rounds):
        for scheme in (ours, native):
            c.barrier()
            counting[0] = r > 0
            for _ in range(args.steps):
                scheme.step(feeds, 0.01)
            counting[0] = False
            if scheme is ours:
                ours.settle()
    every = c.mpi.gather(dict(spans), root=0)
    native.finish()
    if c.rank:
        return 0
    steps = (args.rounds - 1) * args.steps
    print(f"mlp, batch {args.batch}, GPipe M = {args.micro}, 2 ranks, {steps} steps counted"
          + (", glibc keeping freed memory" if args.keep_heap else ""))
    for rank, mine in enumerate(every):
        print(f"rank {rank}: {'phase':<30} {'calls':>6} {'wall ms':>8} {'CPU ms':>8} "
              f"{'faults/step':>11}")
        for name in sorted(mine):
            got = mine[name]
            print(f"        {name:<30} {len(got):>6} "
                  f"{1e3 * statistics.median(b - a for a, b, _, _ in got):>8.3f} "
                  f"{1e3 * statistics.median(u for _, _, u, _ in got):>8.3f} "
                  f"{sum(f for *_, f in got) / steps:>11.1f}")
    first, last = every
    sent = [b for _, b, _, _ in first["d500 forward"]]
    got = [b for _, b, _, _ in last["d500 receive (waiting)"]]
    print(f"d500 activation, stage 0's forward's end to stage 1's receive's end: "
          f"{1e3 * statistics.median(g - s for s, g in zip(sent, got)):.3f} ms")
    back = [b for _, b, _, _ in last["d500 forward+backward (last)"]]
    got = [b for _, b, _, _ in first["d500 receive (waiting)"]]
    print(f"d500 gradient, stage 1's pass's end to stage 0's receive's end: "
          f"{1e3 * statistics.median(g - s for s, g in zip(back, got)):.3f} ms")
    return 0


def _timer(spans: dict[str, list[Span]], counting: list[bool]) -> Any:
    """A function wrapping `owner.name` so that each call adds its Span under `label` to
    `spans` while counting[0] holds."""
    def timed(owner: Any, name: str, label: str) -> None:
        inner = getattr(owner, name)

        def run(*args: Any, **kwargs: Any) -> Any:
            t, u = time.perf_counter(), time.process_time()
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            try:
                return inner(*args, **kwargs)
            finally:
                if counting[0]:
                    spans[label].append((t, time.perf_counter(), time.process_time() - u,
                                         resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                                         - faults))
        setattr(owner, name, run)
    return timed


if __name__ == "__main__":
    sys.exit(main())
