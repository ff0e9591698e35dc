"""The pipeline's measured bubble beside its theory (P-1)/(M+P-1), at 2 ranks (2 stages), for GPipe
and 1F1B at several micro-batch counts, interleaved in one run. Target (issue 20): measured within
20 % of the theory.

Every rank builds the model from the same seed, cuts it in 2 stages (d500.distributed.pipeline)
and trains its stage on random (seeded) batches of `--batch` samples, the same every step; for
each (schedule, M) in turn, round after round, it runs `--steps` steps and reads the stage's wait
for its neighbour over its pipeline passes (`bubble_measured`, as a run records it). The
theory assumes equal stages; a cut falls between nodes, so the partition's stages may not be
(imbalance: costliest / mean stage, forward and backward FLOPs as the cut counts them), and
`cut`, the bubble the schedule leaves on these counted stage costs with free messages
(schedule.simulate), is the formula for this cut. Printed: each stage's median bubble over
rounds, their mean, the theory, mean/theory, `cut` and mean/cut, and rank 0's median time of a
step's pipeline passes; then `best`, the bubble these stages would leave with free messages (the
schedule simulated on each stage's forward and backward CPU seconds per micro-batch, which
other processes on the cores do not inflate; schedule.simulate: the theory's figure for stages
that do not cost the same; with --sleep, whose stages are equal by construction, the theory),
and mean/best. Beside each, unless --sleep, the pipelining baseline (torch's ScheduleGPipe or
Schedule1F1B on the same stages and micro-batches, d500.distributed.pipelining; 1F1B at M >= P):
the median time of a whole step (passes and update) of each, and their ratio d500 / torch
(the issue's target: <= 1.1), and `cpu d/t`: each rank's CPU seconds a step, d500's over
torch's (process time, which other processes on the cores do not inflate; at M = 1 every pass
lies on the step's critical path, so a quiet machine's step follows it). torch measures no bubble
of its own.

    .venv/bin/python benchmarks/pipeline_bubble.py [--model lenet5|mlp] [--batch 256]
    .venv/bin/python benchmarks/pipeline_bubble.py --model mlp --batch 256 --sleep 100
    .venv/bin/python benchmarks/pipeline_bubble.py --model mlp --batch 4096 [--rematerialise]
    .venv/bin/python benchmarks/pipeline_bubble.py --model mlp --hidden 256,256,256,256,256

--hidden sets the MLP's hidden widths (default 128,64, digits-mlp's): five of 256 cut into two
stages within 3 % of each other, where digits-mlp's two layers cannot be (1.23).

--sleep makes every pass of both stages sleep in proportion to its samples (3x for the last
stage's forward-and-backward, 2x for a backward, 1x for a forward): equal stages that do not
compete for a core, so the schedule and its messages are measured apart from the machine's load.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from _args import repetitions
from _mpi import parse_under_mpiexec

from d500.distributed.launch import share_cores


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="lenet5", choices=("lenet5", "mlp"))
    parser.add_argument("--batch", type=int, default=256, help="samples per step")
    parser.add_argument("--hidden", default="128,64", help="the MLP's hidden widths")
    parser.add_argument("--steps", type=int, default=10, help="steps per round and setting")
    parser.add_argument("--rounds", type=repetitions, default=5)
    parser.add_argument("--micro", default="1,2,4,8", help="micro-batch counts")
    parser.add_argument("--sleep", type=float, default=0.0, metavar="US",
                        help="add US microseconds of sleep per sample to every forward (twice "
                             "to every backward) of both stages: stages of equal cost that "
                             "need no core, to see the schedule apart from CPU contention")
    parser.add_argument("--rematerialise", action="store_true",
                        help="d500's stages run each forward again for its backward (the "
                             "backend default, Executable.kept) instead of keeping torch's graph")
    args = parse_under_mpiexec(parser, argv, __file__)
    share_cores()
    from mpi4py import MPI

    from d500 import backends
    from d500.builders import build
    from d500.distributed.comm import Communicator
    from d500.distributed.grid import Grid
    from d500.distributed.pipeline.schedule import simulate
    from d500.distributed.pipeline.scheme import build as pipeline
    from d500.distributed.pipelining import build as pipelining
    from d500.distributed.spec import parse
    from d500.training.optimizers.registry import make

    if args.sleep:
        _synthetic(args.sleep * 1e-6)
    if args.rematerialise:
        from d500.backends.base import Executable
        from d500.backends.torch.executable import TorchExecutable
        TorchExecutable.kept = Executable.kept
    c = Communicator(MPI.COMM_WORLD)
    options = {"hidden": [int(w) for w in args.hidden.split(",")]} if args.model == "mlp" else {}
    model = build(args.model, (1, 8, 8), 10, seed=0, loss=True, **options)
    rng = np.random.default_rng(0)
    feeds = {"input": rng.random((args.batch, 1, 8, 8), dtype=np.float32),
             "labels": rng.integers(0, 10, args.batch).astype(np.int64)}
    settings = [(s, int(m)) for m in args.micro.split(",") for s in ("gpipe", "1f1b")]
    schemes = {}
    for schedule, m in settings:
        spec = parse({"scheme": "sync", "pipeline": c.size, "micro_batches": m,
                      "schedule": schedule}, "benchmark")
        schemes[schedule, m] = pipeline(model, spec, Grid(c, spec.dims(c.size)),
                                        backends.get("torch"), make("sgd", lr=0.01), False)
    natives = {}
    for schedule, m in ([] if args.sleep else settings):
        if schedule == "1f1b" and m < c.size:  # torch's 1F1B needs a micro-batch per stage
            continue
        spec = parse({"scheme": "pipelining", "pipeline": c.size, "micro_batches": m,
                      "schedule": schedule}, "benchmark")
        natives[schedule, m] = pipelining(model, spec, c, backends.get("torch"),
                                          make("sgd", lr=0.01), False, 60.0, args.batch)[1]
    for native in natives.values():  # one process group (init_group), a stage each
        native.start()
    seen: dict[tuple[str, int], list[float]] = {k: [] for k in settings}
    took: dict[tuple[str, int], list[float]] = {k: [] for k in settings}
    passes: dict[tuple[str, int], list[tuple[float, float]]] = {k: [] for k in settings}
    whole: dict[tuple[str, int], list[float]] = {k: [] for k in settings}
    torch_step: dict[tuple[str, int], list[float]] = {k: [] for k in natives}
    cpu: dict[tuple[str, str, int], list[float]] = {}  # (who, schedule, M) -> CPU s a step
    for _ in range(args.rounds):
        for key in settings:
            scheme = schemes[key]
            scheme.step(feeds, 0.01)  # warm: not counted
            scheme.idle = scheme.busy = 0.0
            scheme.compute = {"F": 0.0, "B": 0.0}
            c.barrier()
            t, u = time.perf_counter(), time.process_time()
            for _ in range(args.steps):
                scheme.step(feeds, 0.01)
            whole[key].append((time.perf_counter() - t) / args.steps)
            cpu.setdefault(("d500", *key), []).append((time.process_time() - u) / args.steps)
            scheme.settle()  # its last sends, before another setting's
            seen[key].append(scheme.figures()["bubble_measured"])
            took[key].append(scheme.busy / args.steps)
            passes[key].append((scheme.compute["F"], scheme.compute["B"]))
            if key in natives:
                natives[key].step(feeds, 0.01)
                c.barrier()
                t, u = time.perf_counter(), time.process_time()
                for _ in range(args.steps):
                    natives[key].step(feeds, 0.01)
                torch_step[key].append((time.perf_counter() - t) / args.steps)
                cpu.setdefault(("torch", *key), []).append((time.process_time() - u) / args.steps)
    every = c.mpi.gather({k: statistics.median(v) for k, v in seen.items()}, root=0)
    costs = c.mpi.gather({k: tuple(statistics.median(p[j] for p in v) for j in (0, 1))
                          for k, v in passes.items()}, root=0)
    step = {k: statistics.median(v) for k, v in took.items()}
    cpus = c.mpi.gather({k: statistics.median(v) for k, v in cpu.items()}, root=0)
    if c.rank == 0:
        part = next(iter(schemes.values())).stage.part
        nodes = part.model_proto.graph.node
        first = [s.nodes[0] for s in part.stages[1:]]
        print(f"{args.model}{' ' + args.hidden if options else ''}, batch {args.batch}, "
              f"{c.size} stages cut before {', '.join(f'{nodes[k].op_type}#{k}' for k in first)}"
              f", fwd+bwd kFLOP/sample {' : '.join(f'{s.cost / 1e3:.1f}' for s in part.stages)}"
              f" (imbalance {part.imbalance:.3f}), {args.rounds} rounds x {args.steps} steps")
        print(f"{'schedule':>8} {'M':>3} " + " ".join(f"{'stage ' + str(r):>8}"
                                                     for r in range(c.size))
              + f" {'mean':>7} {'theory':>7} {'ratio':>6} {'cut':>6} {'ratio':>6}"
              + f" {'pass ms':>8} {'best':>6} {'ratio':>6}"
              + (f" {'d500 ms':>8} {'torch ms':>8} {'d500/torch':>10} cpu d/t by rank"
                 if natives else ""))
        for key in settings:
            stages = [e[key] for e in every]
            mean = statistics.fmean(stages)
            theory = schemes[key].figures()["bubble_theory"]
            best = theory if args.sleep else statistics.fmean(simulate(
                key[0], [e[key][0] for e in costs], [e[key][1] for e in costs], key[1]))
            counted = theory if args.sleep else statistics.fmean(simulate(
                key[0], [s.forward for s in part.stages],
                [s.cost - s.forward for s in part.stages], key[1]))
            print(f"{key[0]:>8} {key[1]:>3} " + " ".join(f"{b:>8.3f}" for b in stages)
                  + f" {mean:>7.3f} {theory:>7.3f} {mean / theory:>6.2f} {counted:>6.3f}"
                  f" {mean / counted:>6.2f} "
                  f"{1e3 * step[key]:>8.2f} {best:>6.3f} {mean / best:>6.2f}"
                  + (_versus(whole[key], torch_step[key]) + " " + " ".join(
                      f"{e[('d500', *key)] / e[('torch', *key)]:.2f}" for e in cpus)
                     if key in natives else ""))
    if natives:
        next(iter(natives.values())).finish()
    return 0


def _versus(d500: list[float], native: list[float]) -> str:
    """d500's and torch's median whole-step ms and the ratio of the medians."""
    a, b = statistics.median(d500), statistics.median(native)
    return f" {1e3 * a:>8.2f} {1e3 * b:>8.2f} {a / b:>10.2f}"


def _synthetic(per_sample: float) -> None:
    """Every stage pass sleeps per_sample x its samples (backward: twice) before computing."""
    import time

    from d500.distributed.pipeline.stage import StageModel

    def slowed(fn, times):
        def run(self, given, *rest):  # feeds by name, or (backward) what the forward kept
            samples = rest[0][0] if times == 2 else next(iter(given.values()))
            time.sleep(times * per_sample * len(samples))
            return fn(self, given, *rest)
        return run
    StageModel.forward = slowed(StageModel.forward, 1)
    StageModel.loss = slowed(StageModel.loss, 3)  # the last stage's forward and backward
    StageModel.backward = slowed(StageModel.backward, 2)


if __name__ == "__main__":
    sys.exit(main())
