"""Per-layer ZeRO-3 with prefetch (the next layer's gather under way while one computes) against
one layer at a time: step time and peak parameter bytes per rank, interleaved, 2 ranks.

The memory target (issue 20): a rank holds at most 1/N of the parameters and optimizer state
plus one layer's parameters. Prefetching holds two layers at once; one at a time holds one. This
prints what the second layer buys in step time, measured side by side in one run.

    .venv/bin/python benchmarks/zero3_prefetch.py [--model mlp|lenet5|transformer] [--batch 32]

Both sides are d500.distributed.schemes.zero3.Zero3 on the same ONNX model, optimizer (momentum)
and seeded random batch; repetitions alternate which side goes first; a repetition's time is the
slowest rank's. The ratio printed is throughput one-at-a-time / prefetch (< 1: prefetch faster).
"""

from __future__ import annotations

import argparse
import sys

from _args import repetitions
from _mpi import parse_under_mpiexec

from d500.distributed.launch import share_cores

SHAPES = {"mlp": (1, 8, 8), "lenet5": (1, 8, 8)}
LM = {"context": 64, "vocab": 1024, "layers": 2, "width": 64, "heads": 4, "tied": True}  # text-lm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", choices=[*SHAPES, "transformer"])
    parser.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    parser.add_argument("--repetitions", type=repetitions, default=15)
    parser.add_argument("--number", type=int, default=10, help="steps per timed repetition")
    args = parse_under_mpiexec(parser, argv, __file__)
    share_cores()  # before torch is imported: one intra-op thread per rank on 2 cores
    import statistics

    import numpy as np
    from ratio import interleave, report

    from d500 import backends, builders
    from d500.distributed.comm import Communicator
    from d500.distributed.schemes.zero3 import Zero3
    from d500.training.optimizers import make

    comm = Communicator.for_world()
    if comm.size < 2:
        print("run under mpiexec -n 2 (or more)", file=sys.stderr)
        return 2
    rng = np.random.default_rng(comm.rank)
    if args.model == "transformer":
        model = builders.build_lm("transformer", seed=0, loss=True, **LM)
        tokens = rng.integers(0, LM["vocab"], (args.batch, LM["context"] + 1))
        feeds = {"input": tokens[:, :-1], "labels": tokens[:, 1:]}
    else:
        shape = SHAPES[args.model]
        model = builders.build(args.model, input_shape=shape, classes=10, seed=0, loss=True)
        feeds = {"input": rng.standard_normal((args.batch, *shape)).astype(np.float32),
                 "labels": rng.integers(0, 10, args.batch).astype(np.int64)}
    torch_backend = backends.get("torch")
    sides = {ahead: Zero3(model, torch_backend, make("momentum", lr=0.01, momentum=0.9), comm,
                          prefetch=ahead) for ahead in (True, False)}
    for scheme in sides.values():
        scheme.start()
        for _ in range(5):  # warm up (allocations, MPI connections)
            scheme.step(feeds, 0.01)
    comm.mpi.Barrier()
    ahead, one = interleave(lambda: sides[True].step(feeds, 0.01),
                            lambda: sides[False].step(feeds, 0.01),
                            args.repetitions, args.number)
    ahead = comm.allgather(np.array(ahead)).max(axis=0).tolist()
    one = comm.allgather(np.array(one)).max(axis=0).tolist()
    peaks = {k: comm.allgather(np.array([s.figures()["peak_param_bytes"]]))
             for k, s in sides.items()}
    for scheme in sides.values():
        scheme.finish()
    if comm.rank == 0:
        print(f"{args.model}, batch {args.batch} per rank, {comm.size} ranks, "
              f"{args.repetitions} repetitions x {args.number} steps")
        print(f"step time: prefetch {statistics.median(ahead) * 1e3:.3f} ms, one layer at a "
              f"time {statistics.median(one) * 1e3:.3f} ms")
        ratio = report(f"{args.model} zero3 one-at-a-time vs prefetch", one, ahead,
                       args.batch * comm.size)
        print(f"one layer at a time: step time = {1 / ratio:.3f} x prefetch's")
        for k, label in ((True, "prefetch"), (False, "one at a time")):
            print(f"peak parameter bytes per rank, {label}: "
                  f"{', '.join(f'{int(p[0]):,}' for p in peaks[k])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
