"""d500's synchronous scheme (or another: --scheme) against torch DistributedDataParallel (gloo):
one training step at 2 ranks on the same model, batch and optimizer, interleaved. Target: d500 <=
1.05 x DDP's step time (issue 20: each scheme <= 1.1 x its native baseline's).

Every rank builds the model twice from the same seed (the torch backend's translation of the ONNX
model: the same module DDP wraps in the `ddp-baseline` entry), one trained by d500's `sync` scheme
(gradients by autograd, one fused MPI Allreduce per 25 MB bucket, the d500 momentum update), the
other by d500.distributed.ddp (DDP's bucketed gloo allreduce overlapped with backward, then the
same update). Repetitions alternate which side goes first; a repetition's time is the slowest
rank's. It prints per-step times and the throughput ratio d500/DDP (median over repetitions, with
the quartiles); >= 0.952 meets the target.

    .venv/bin/python benchmarks/step_vs_ddp.py [--model lenet5|mlp|resnet20] [--batch 64]
    .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/step_vs_ddp.py
    .venv/bin/python benchmarks/step_vs_ddp.py --model mlp --scheme zero2   # zero1, ssp, ps, ...
    .venv/bin/python benchmarks/step_vs_ddp.py --model mlp --scheme zero3 --baseline fsdp

--scheme zero1/zero2/zero3 is sync with that ZeRO stage (d500.distributed.schemes.zero; zero3
layer by layer, d500.distributed.schemes.zero3, one layer at a time unless --prefetch);
--baseline fsdp times torch FSDP2 (d500.distributed.fsdp) instead of DDP; ssp runs with
staleness 2; a parameter server's step time is its rank's, the slowest rank's per repetition.

Inputs are random (seeded) batches of the model's input shape, the same every step; nothing is
evaluated. On a shared machine both sides suffer the same load, which interleaving keeps fair.
"""

from __future__ import annotations

import argparse
import sys

from _args import repetitions
from _mpi import parse_under_mpiexec

from d500.distributed.launch import share_cores

SHAPES = {"mlp": (1, 8, 8), "lenet5": (1, 8, 8), "resnet20": (3, 32, 32)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="lenet5", choices=sorted(SHAPES))
    parser.add_argument("--batch", type=int, default=64, help="samples per rank and step")
    parser.add_argument("--scheme", default="sync",
                        help="d500's side: a scheme's name, or zero1..zero3 (default sync)")
    parser.add_argument("--baseline", default="ddp", choices=("ddp", "fsdp"),
                        help="torch's side: DistributedDataParallel or FSDP2 (default ddp)")
    parser.add_argument("--prefetch", action="store_true",
                        help="zero3: the next layer's gather during a layer (option prefetch)")
    parser.add_argument("--repetitions", type=repetitions, default=15)
    parser.add_argument("--number", type=int, default=10, help="steps per timed repetition")
    args = parse_under_mpiexec(parser, argv, __file__)
    share_cores()  # before torch is imported: one intra-op thread per rank on 2 cores
    import numpy as np
    from ratio import interleave, report

    from d500 import backends, builders
    from d500.distributed import schemes
    from d500.distributed.comm import Communicator
    from d500.distributed.ddp import DDPScheme
    from d500.training.optimizers import make

    comm = Communicator.for_world()
    if comm.size < 2:
        print("run under mpiexec -n 2 (or more)", file=sys.stderr)
        return 2
    shape = SHAPES[args.model]
    model = builders.build(args.model, input_shape=shape, classes=10, seed=0, loss=True)
    torch_backend = backends.get("torch")

    def trainer():
        optimizer = make("momentum", lr=0.01, momentum=0.9)
        return torch_backend.prepare(model).trainer(optimizer, loss="loss")

    rng = np.random.default_rng(comm.rank)
    feeds = {"input": rng.standard_normal((args.batch, *shape)).astype(np.float32),
             "labels": rng.integers(0, 10, args.batch).astype(np.int64)}
    if args.scheme == "zero3":  # layer by layer, each layer a sub-model of its own
        from d500.distributed.schemes.zero3 import Zero3
        sync = Zero3(model, torch_backend, make("momentum", lr=0.01, momentum=0.9), comm,
                     prefetch=args.prefetch)
    elif args.scheme in ("zero1", "zero2"):
        from d500.distributed.schemes.zero import Zero
        sync = Zero(trainer(), comm, stage=int(args.scheme[-1]))
    else:
        sync = schemes.make(args.scheme, trainer(), comm,
                            **({"staleness": 2} if args.scheme == "ssp" else {}))
    if args.baseline == "fsdp":
        from d500.distributed.fsdp import FSDPScheme
        ddp = FSDPScheme(trainer(), comm)
    else:
        ddp = DDPScheme(trainer(), comm)
    name = args.baseline.upper()
    sync.start()
    ddp.start()
    for _ in range(5):  # warm up both (allocations, MPI and gloo connections)
        sync.step(feeds, 0.01)
        ddp.step(feeds, 0.01)
    sync.settle()  # a server's replies still owed
    comm.mpi.Barrier()
    calls = [0]

    def d500_step() -> None:  # a block of steps ends settled (a server's replies before gloo's)
        sync.step(feeds, 0.01)
        calls[0] += 1
        if calls[0] % args.number == 0:
            sync.settle()

    d500, native = interleave(d500_step, lambda: ddp.step(feeds, 0.01),
                              args.repetitions, args.number)
    sync.finish()
    d500 = comm.allgather(np.array(d500)).max(axis=0).tolist()
    native = comm.allgather(np.array(native)).max(axis=0).tolist()
    if comm.rank == 0:
        import statistics

        import torch
        print(f"{args.model} {shape}, batch {args.batch} per rank, {comm.size} ranks, "
              f"torch {torch.__version__}, {torch.get_num_threads()} thread(s) per rank; "
              f"{args.repetitions} repetitions x {args.number} steps")
        print(f"step time: d500 {args.scheme} {statistics.median(d500) * 1e3:.3f} ms, {name} "
              f"{statistics.median(native) * 1e3:.3f} ms")
        ratio = report(f"{args.model} {args.scheme} step vs {name}", d500, native,
                       args.batch * comm.size)
        print(f"d500 step time = {1 / ratio:.3f} x {name}'s (target <= 1.05)")
    peak = sync.figures().get("peak_param_bytes")
    if peak is not None:  # every rank's own: the most any holds at once
        peaks = comm.allgather(np.array([peak]))
        if comm.rank == 0:
            print(f"d500 {args.scheme} peak parameter bytes per rank: "
                  f"{', '.join(f'{int(p[0]):,}' for p in peaks)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
